/*
 * route_emu.c - host emulation of moe_route.cu's logits schedule and moe_group.cu's index
 * math, checked against straightforward implementations (no GPU needed).
 *   logits: the original kernel (lane l sums float4 columns l, l+32, ... with fmaf, then the
 *           shfl_xor butterfly 16..1, lane 0's value) vs the tiled schedule (64x64 blocks,
 *           chain split S from m, bit-reversed chains, 8-column stages zero-padded, binary
 *           counter merge, pairwise tree over S) - compared bit for bit.
 *   group:  count / prefix / scatter with the kernels' chunking and per-32 ranks vs a
 *           stable-by-pair-index grouping; every table compared.
 * Build: cc -O2 -std=c11 -Wall -Wextra route_emu.c -lm -o route_emu && ./route_emu
 * Prints one line per failed case and "N passed, M failed".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float frand(void) { return ((int)(rnd() % 2000001) - 1000000) / 1000000.0f; }
static uint16_t to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }
static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static int n_pass, n_fail;

/* ---- logits ------------------------------------------------------------------------- */
static float orig_logit(const uint16_t *xr, const float *rr, int h)
{
    float v[32], nv[32];
    int n4 = h / 4;
    for (int l = 0; l < 32; l++) {
        float acc = 0.f;
        for (int i = l; i < n4; i += 32) {
            acc = fmaf(rr[4 * i + 0], bf(xr[4 * i + 0]), acc);
            acc = fmaf(rr[4 * i + 1], bf(xr[4 * i + 1]), acc);
            acc = fmaf(rr[4 * i + 2], bf(xr[4 * i + 2]), acc);
            acc = fmaf(rr[4 * i + 3], bf(xr[4 * i + 3]), acc);
        }
        v[l] = acc;
    }
    for (int o = 16; o > 0; o >>= 1) {
        for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
        memcpy(v, nv, sizeof v);
    }
    return v[0];
}

#define TM 64
#define TE 64
#define JS 8
#define TARGET 256
static int split(int m, int E)
{
    long long tiles = (long long)((E + TE - 1) / TE) * ((m + TM - 1) / TM);
    int s = 1;
    while (s < 32 && tiles * s < TARGET) s *= 2;
    return s;
}
static size_t scratch_rows(int m, int E)
{
    long long cap = 2LL * TARGET * TM / ((E + TE - 1) / TE);
    long long rows = m > cap ? m : cap;
    if (rows > 32LL * m) rows = 32LL * m;
    return (size_t)rows;
}
static uint32_t brev5(uint32_t c) { uint32_t r = 0; for (int i = 0; i < 5; i++) r |= ((c >> i) & 1) << (4 - i); return r; }
static float tree(const float *p, size_t stride, int n)
{
    return n == 1 ? p[0] : tree(p, stride, n / 2) + tree(p + (size_t)(n / 2) * stride, stride, n / 2);
}

static void tiled_logits(const uint16_t *x, const float *router, int m, int h, int E, float *out)
{
    int S = split(m, E), C = 32 / S, n4 = h >> 2;
    int ncc = (n4 + 31) / 32, nst = (ncc + JS - 1) / JS, nstages = C * nst;
    if ((size_t)S * m > scratch_rows(m, E)) { printf("FAIL scratch bound m=%d E=%d\n", m, E); n_fail++; }
    float *part = calloc((size_t)S * m * E, sizeof(float));
    static float xs[JS][TM][4], rs[JS][TE][4], acc[TM][TE], slots[5][TM][TE];
    for (int q = 0; q < S; q++)
        for (int by = 0; by < (m + TM - 1) / TM; by++)
            for (int bx = 0; bx < (E + TE - 1) / TE; bx++) {
                int t0 = by * TM, e0 = bx * TE;
                memset(acc, 0, sizeof acc);
                for (int g = 0; g < nstages; g++) {
                    int ci = g / nst, sti = g % nst, l = (int)brev5((uint32_t)(q * C + ci));
                    for (int i = 0; i < 512; i++) { /* route_load, all threads */
                        int jj = i / TM, row = i % TM, f = 32 * (sti * JS + jj) + l;
                        int t = t0 + row, e = e0 + row;
                        for (int c = 0; c < 4; c++) {
                            xs[jj][row][c] = f < n4 && t < m ? bf(x[(size_t)t * h + 4 * f + c]) : 0.f;
                            rs[jj][row][c] = f < n4 && e < E ? router[(size_t)e * h + 4 * f + c] : 0.f;
                        }
                    }
                    for (int T = 0; T < TM; T++)
                        for (int El = 0; El < TE; El++) {
                            int wt0 = T / 32 * 32, we0 = El / 16 * 16;
                            if (t0 + wt0 < m && e0 + we0 < E)
                                for (int jj = 0; jj < JS; jj++) {
                                    float s = acc[T][El];
                                    for (int c = 0; c < 4; c++) s = fmaf(rs[jj][El][c], xs[jj][T][c], s);
                                    acc[T][El] = s;
                                }
                            if (sti == nst - 1) {
                                float v = acc[T][El];
                                int lvl = 0;
                                for (int cc = ci; cc & 1; cc >>= 1, lvl++) v = slots[lvl][T][El] + v;
                                if (ci == C - 1) {
                                    if (t0 + T < m && e0 + El < E)
                                        part[((size_t)q * m + t0 + T) * E + e0 + El] = v;
                                } else {
                                    if (lvl >= 5) { printf("FAIL slot level %d\n", lvl); n_fail++; }
                                    slots[lvl][T][El] = v;
                                }
                                acc[T][El] = 0.f;
                            }
                        }
                }
            }
    for (int t = 0; t < m; t++)
        for (int e = 0; e < E; e++) out[(size_t)t * E + e] = tree(part + (size_t)t * E + e, (size_t)m * E, S);
    free(part);
}

static void check_logits(int m, int h, int E, int tiny)
{
    uint16_t *x = malloc((size_t)m * h * 2);
    float *r = malloc((size_t)E * h * 4), *a = malloc((size_t)m * E * 4), *b = malloc((size_t)m * E * 4);
    for (size_t i = 0; i < (size_t)m * h; i++) x[i] = to_bf16(frand() * (tiny && i % 3 == 0 ? 1e-30f : 3.f));
    for (size_t i = 0; i < (size_t)E * h; i++) r[i] = frand() * (tiny && i % 2 ? 1e-20f : 0.05f);
    tiled_logits(x, r, m, h, E, b);
    int bad = 0;
    for (int t = 0; t < m; t++)
        for (int e = 0; e < E; e++) {
            a[(size_t)t * E + e] = orig_logit(x + (size_t)t * h, r + (size_t)e * h, h);
            if (bits(a[(size_t)t * E + e]) != bits(b[(size_t)t * E + e]) &&
                !(a[(size_t)t * E + e] == 0.f && b[(size_t)t * E + e] == 0.f)) {
                if (bad++ < 3)
                    printf("FAIL logits m=%d h=%d E=%d tiny=%d t=%d e=%d: orig %.9g tiled %.9g\n", m,
                           h, E, tiny, t, e, a[(size_t)t * E + e], b[(size_t)t * E + e]);
            }
        }
    bad ? n_fail++ : n_pass++;
    free(x), free(r), free(a), free(b);
}

/* ---- group -------------------------------------------------------------------------- */
#define PB 2048
#define WARPS 8
static int popc(uint32_t v) { return __builtin_popcount(v); }

typedef struct { int32_t *te, *src, *dst; float *w; } tables;
static void tables_alloc(tables *t, size_t slots, int tm)
{
    t->te = malloc(slots * 4); t->src = malloc(slots * tm * 4); t->dst = malloc(slots * tm * 4);
    t->w = malloc(slots * tm * 4);
    for (size_t i = 0; i < slots; i++) t->te[i] = 12345;
    for (size_t i = 0; i < slots * tm; i++) t->src[i] = t->dst[i] = 777, t->w[i] = 9.f; /* poison */
}

static void group_simple(const int32_t *ids, const float *w, long long P, int k, int E, int tm, int ns, tables *o)
{
    int *cnt = calloc(E, 4), slot = 0;
    for (long long p = 0; p < P; p++) if (ids[p] >= 0 && ids[p] < E) cnt[ids[p]]++;
    for (int s = 0; s < ns; s++) o->te[s] = -1;
    for (long long r = 0; r < (long long)ns * tm; r++) o->src[r] = -1, o->dst[r] = -1, o->w[r] = 0.f;
    for (int e = 0; e < E; e++) {
        int row = slot * tm;
        for (long long p = 0; p < P; p++)
            if (ids[p] == e) o->src[row] = (int)(p / k), o->dst[row] = (int)p, o->w[row] = w[p], row++;
        int nt = (cnt[e] + tm - 1) / tm;
        for (int s = 0; s < nt; s++) o->te[slot + s] = e;
        slot += nt;
    }
    free(cnt);
}

static void group_emu(const int32_t *ids, const float *w, long long P, int k, int E, int tm, int ns, tables *o)
{
    int nb = (int)((P + PB - 1) / PB);
    int32_t *counts = malloc((size_t)nb * E * 4);
    /* count kernel */
    for (int b = 0; b < nb; b++) {
        for (int e = 0; e < E; e++) counts[(size_t)b * E + e] = 0;
        for (int i = 0; i < PB; i++) {
            long long p = (long long)b * PB + i;
            if (p >= P) break;
            if (ids[p] >= 0 && ids[p] < E) counts[(size_t)b * E + ids[p]]++;
        }
    }
    /* prefix kernel: 4 parts per expert */
    enum { PARTS = 4 };
    int part[PARTS][256], tot[256], tstart[257];
    for (int r = 0; r < PARTS; r++)
        for (int e = 0; e < E; e++) {
            int b0 = (int)((long long)nb * r / PARTS), b1 = (int)((long long)nb * (r + 1) / PARTS), s = 0;
            for (int b = b0; b < b1; b++) s += counts[(size_t)b * E + e];
            part[r][e] = s;
        }
    { /* warp scan: lane owns 8 consecutive experts */
        int run[32], nt[32][8], incl[32];
        for (int lane = 0; lane < 32; lane++) {
            run[lane] = 0;
            for (int i = 0; i < 8; i++) {
                int ee = lane * 8 + i, c = 0;
                if (ee < E) { for (int rr = 0; rr < PARTS; rr++) c += part[rr][ee]; tot[ee] = c; }
                nt[lane][i] = (c + tm - 1) / tm;
                run[lane] += nt[lane][i];
            }
            incl[lane] = run[lane];
        }
        for (int off = 1; off < 32; off <<= 1) {
            int nv[32];
            for (int lane = 0; lane < 32; lane++) nv[lane] = incl[lane] + (lane >= off ? incl[lane - off] : 0);
            memcpy(incl, nv, sizeof nv);
        }
        for (int lane = 0; lane < 32; lane++) {
            int start = incl[lane] - run[lane];
            for (int i = 0; i < 8; i++) { int ee = lane * 8 + i; if (ee < E) tstart[ee] = start; start += nt[lane][i]; }
        }
        tstart[E] = incl[31];
    }
    for (int r = 0; r < PARTS; r++)
        for (int e = 0; e < E; e++) {
            int b0 = (int)((long long)nb * r / PARTS), b1 = (int)((long long)nb * (r + 1) / PARTS);
            int base = tstart[e] * tm;
            for (int rr = 0; rr < r; rr++) base += part[rr][e];
            for (int b = b0; b < b1; b++) { int c = counts[(size_t)b * E + e]; counts[(size_t)b * E + e] = base; base += c; }
        }
    int used = tstart[E];
    for (int s = 0; s < ns; s++) {
        int ex = -1;
        if (s < used) {
            int lo = 0, hi = E - 1;
            while (lo < hi) { int mid = (lo + hi + 1) >> 1; if (tstart[mid] <= s) lo = mid; else hi = mid - 1; }
            ex = lo;
        }
        o->te[s] = ex;
    }
    for (int i = 0; i < E * tm; i++) {
        int ex = i / tm, off = tot[ex] + i % tm;
        if (off < (tstart[ex + 1] - tstart[ex]) * tm) {
            long long row = (long long)tstart[ex] * tm + off;
            o->src[row] = -1, o->dst[row] = -1, o->w[row] = 0.f;
        }
    }
    for (long long row = (long long)used * tm; row < (long long)ns * tm; row++) o->src[row] = -1, o->dst[row] = -1, o->w[row] = 0.f;
    /* scatter kernel */
    static int wcnt[WARPS][256];
    for (int b = 0; b < nb; b++) {
        memset(wcnt, 0, sizeof wcnt);
        for (int wp = 0; wp < WARPS; wp++)
            for (int c = 0; c < PB / WARPS; c++) {
                long long p = (long long)b * PB + (long long)wp * (PB / WARPS) + c;
                int e = p < P ? ids[p] : -1;
                if (e >= 0 && e < E) wcnt[wp][e]++;
            }
        for (int e = 0; e < E; e++) {
            int base = counts[(size_t)b * E + e];
            for (int wp = 0; wp < WARPS; wp++) { int c = wcnt[wp][e]; wcnt[wp][e] = base; base += c; }
        }
        for (int wp = 0; wp < WARPS; wp++)
            for (int c = 0; c < PB / WARPS; c += 32) {
                int ev[32], ok[32];
                for (int lane = 0; lane < 32; lane++) {
                    long long p = (long long)b * PB + (long long)wp * (PB / WARPS) + c + lane;
                    ev[lane] = p < P ? ids[p] : -1;
                    ok[lane] = ev[lane] >= 0 && ev[lane] < E;
                    if (!ok[lane]) ev[lane] = -1;
                }
                uint32_t same[32];
                for (int lane = 0; lane < 32; lane++) {
                    same[lane] = 0;
                    for (int o2 = 0; o2 < 32; o2++) if (ev[o2] == ev[lane]) same[lane] |= 1u << o2;
                }
                for (int lane = 0; lane < 32; lane++) {
                    if (!ok[lane]) continue;
                    long long p = (long long)b * PB + (long long)wp * (PB / WARPS) + c + lane;
                    int pos = wcnt[wp][ev[lane]] + popc(same[lane] & ((1u << lane) - 1u));
                    o->src[pos] = (int)(p / k), o->dst[pos] = (int)p, o->w[pos] = w[p];
                }
                for (int lane = 0; lane < 32; lane++)
                    if (ok[lane] && (same[lane] & ((1u << lane) - 1u)) == 0) wcnt[wp][ev[lane]] += popc(same[lane]);
            }
    }
    free(counts);
}

static void check_group(const char *name, int m, int k, int E, int tm, int mode)
{
    long long P = (long long)m * k;
    int32_t *ids = malloc(P * 4);
    float *w = malloc(P * 4);
    int *perm = malloc(E * 4);
    for (int t = 0; t < m; t++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int s = 0; s < k; s++) { /* k distinct experts per token, modes skew the choice */
            int lim = E - s, j;
            if (mode == 1) j = 0;                                  /* first free: tokens pile up */
            else if (mode == 2) j = (int)(rnd() % (lim < 3 ? lim : 3)); /* few experts, many empty */
            else j = (int)(rnd() % lim);
            int e = perm[j]; perm[j] = perm[lim - 1]; perm[lim - 1] = e;
            ids[(size_t)t * k + s] = e;
            w[(size_t)t * k + s] = frand();
        }
    }
    if (mode == 3) for (long long p = 0; p < P; p += 7) ids[p] = (p & 1) ? -1 : E; /* invalid ids skipped */
    if (mode == 4) for (long long p = 0; p < P; p++) ids[p] = E - 1;               /* all on one expert */
    long long nsl = (P + tm - 1) / tm + E;
    int ns = (int)nsl;
    tables a, b;
    tables_alloc(&a, ns, tm), tables_alloc(&b, ns, tm);
    group_simple(ids, w, P, k, E, tm, ns, &a);
    group_emu(ids, w, P, k, E, tm, ns, &b);
    int bad = 0;
    for (int s = 0; s < ns && bad < 3; s++)
        if (a.te[s] != b.te[s]) { printf("FAIL group %s m=%d k=%d E=%d tm=%d: tile_expert[%d] %d vs %d\n", name, m, k, E, tm, s, a.te[s], b.te[s]); bad++; }
    for (long long r = 0; r < (long long)ns * tm && bad < 3; r++)
        if (a.src[r] != b.src[r] || a.dst[r] != b.dst[r] || bits(a.w[r]) != bits(b.w[r])) {
            printf("FAIL group %s m=%d k=%d E=%d tm=%d: row %lld (src,dst,w) (%d,%d,%g) vs (%d,%d,%g)\n", name, m, k, E, tm, r, a.src[r], a.dst[r], a.w[r], b.src[r], b.dst[r], b.w[r]);
            bad++;
        }
    bad ? n_fail++ : n_pass++;
    free(ids), free(w), free(perm);
    free(a.te), free(a.src), free(a.dst), free(a.w), free(b.te), free(b.src), free(b.dst), free(b.w);
}

int main(void)
{
    /* logits: h not a multiple of 128 (short chains), h < 128 (empty chains), E < 64 and
     * not a multiple of 64, m crossing tile edges, every split S from 32 down to 1 */
    int lc[][3] = {{1, 64, 8}, {1, 4, 1}, {1, 68, 3}, {3, 132, 65}, {1, 6144, 128}, {64, 640, 128},
                   {65, 384, 256}, {200, 256, 128}, {513, 128, 128}, {1100, 64, 200}, {2049, 68, 64},
                   {4100, 4, 128}, {17, 16384, 5}, {8300, 4, 64}};
    int nl = (int)(sizeof lc / sizeof lc[0]);
    for (int i = 0; i < nl; i++) {
        check_logits(lc[i][0], lc[i][1], lc[i][2], 0);
        check_logits(lc[i][0], lc[i][1], lc[i][2], 1);
    }
    int S[] = {1, 64, 512, 4096, 16384};
    for (int i = 0; i < 5; i++) printf("info: E=128 m=%d split S=%d\n", S[i], split(S[i], 128));
    /* scratch bound never decreases with m and covers S*m */
    for (int E = 1; E <= 256; E += 17) {
        size_t prev = 0;
        int bad = 0;
        for (int m = 1; m <= 20000; m++) {
            size_t r = scratch_rows(m, E);
            if (r < prev || r < (size_t)split(m, E) * m) bad++;
            prev = r;
        }
        if (bad) printf("FAIL scratch bound E=%d: %d bad m\n", E, bad);
        bad ? n_fail++ : n_pass++;
    }
    /* group */
    int gc[][4] = {{1, 1, 1, 64}, {1, 8, 128, 64}, {1, 256, 256, 64}, {3, 256, 256, 64},
                   {64, 8, 128, 64}, {257, 8, 256, 64}, {4096, 8, 128, 64}, {16384, 8, 128, 64},
                   {1000, 256, 256, 64}, {513, 6, 64, 64}, {300, 4, 7, 8}, {77, 3, 5, 1},
                   {999, 2, 256, 100}, {2048, 1, 1, 64}, {5000, 2, 3, 64}};
    const char *mn[] = {"random", "pile-up", "few-experts", "invalid-ids", "one-expert"};
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++)
        for (int mode = 0; mode < 5; mode++) check_group(mn[mode], gc[i][0], gc[i][1], gc[i][2], gc[i][3], mode);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
