/* fp4moe.c - the command-line tool (placeholder while the library is assembled). */
#include <stdio.h>

#include "fp4moe.h"

int main(void)
{
    printf("fp4moe %s\n", FP4MOE_VERSION);
    return 0;
}
