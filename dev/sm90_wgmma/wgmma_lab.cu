/*
 * wgmma_lab.cu - lab for the sm_90a wgmma grouped MoE GEMM (src/cuda/sm90_w4a16_wgmma.cu):
 * builds random grouped problems in the fp4_mma_gemm_args form (NVFP4 weights permuted with
 * fp4_mma_permute_row, host grouping into 64-row slots like moe_group.cu), runs the wgmma
 * kernel and the mma.sync kernel (fp4_mma_gemm) on the same inputs with poisoned outputs,
 * compares them with each other over every written element and with a CPU fp64 reference
 * (all rows for small cases, sampled rows for the tp8 shapes), then times both with the L2
 * flushed between repetitions (median of CUDA events).
 * Build: dev/sm90_wgmma/build.sh. Run: build-wgmma/wgmma_lab [--quick | --small | --probe]
 * (--quick: tp8 M=512 only; --small: edge cases only, for compute-sanitizer). Needs sm_90.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#include "moe_group.cuh"
#include "sm90_w4a16_wgmma.cuh"
#include "w4a16_mma_gemm.cuh"

static int n_pass, n_fail;

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            printf("FAIL: %s -> %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double urand(void) { return (rnd() >> 11) * (1.0 / 9007199254740992.0); }

static uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static double bf2d(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double e2m1_val(int c)
{
    static const double t[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8 ? -1 : 1) * t[c & 7];
}
static double e4m3_val(int c)
{
    static double t[256];
    static int init;
    if (!init) {
        for (int i = 0; i < 256; i++) {
            int e = (i >> 3) & 15, m = i & 7;
            double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
            t[i] = i & 0x80 ? -v : v;
        }
        init = 1;
    }
    return t[c & 0xff];
}
/* scale codes: mostly normal 2^-3..2^1, some subnormal, some zero */
static uint8_t rand_scale(void)
{
    double u = urand();
    if (u < 0.01) return 0;
    if (u < 0.03) return (uint8_t)(1 + rnd() % 7);
    return (uint8_t)(0x20 + rnd() % 0x28);
}

struct problem {
    int E, H, I, M, K; /* K = top-k */
    int identity;      /* shared-expert style: no tile tables, expert 0, identity rows */
    std::vector<uint8_t> w13, s13, w2, s2; /* unpermuted */
    std::vector<float> g13, g2, wts;
    std::vector<int32_t> ids;
    std::vector<uint16_t> x;
    /* grouping */
    int n_slots, used_slots;
    std::vector<int32_t> te, rsrc, rdst;
    std::vector<float> rw;
};

static void make_problem(problem &p, int E, int H, int I, int M, int K, int identity)
{
    p.E = E, p.H = H, p.I = I, p.M = M, p.K = K, p.identity = identity;
    size_t n13 = (size_t)E * 2 * I * H, n2 = (size_t)E * H * I;
    p.w13.resize(n13 / 2), p.s13.resize(n13 / 16), p.w2.resize(n2 / 2), p.s2.resize(n2 / 16);
    for (size_t i = 0; i < p.w13.size(); i += 8) {
        uint64_t r = rnd();
        memcpy(&p.w13[i], &r, std::min<size_t>(8, p.w13.size() - i));
    }
    for (size_t i = 0; i < p.w2.size(); i += 8) {
        uint64_t r = rnd();
        memcpy(&p.w2[i], &r, std::min<size_t>(8, p.w2.size() - i));
    }
    for (auto &s : p.s13) s = rand_scale();
    for (auto &s : p.s2) s = rand_scale();
    p.g13.resize(2 * E), p.g2.resize(E);
    for (int e = 0; e < E; e++) {
        p.g13[2 * e] = (float)(0.01 + 0.02 * urand()) * 96.f / sqrtf((float)H) * 0.6f;
        p.g13[2 * e + 1] = (float)(0.01 + 0.02 * urand()) * 96.f / sqrtf((float)H) * 0.6f;
        p.g2[e] = (float)(0.02 + 0.04 * urand()) * 24.f / sqrtf((float)I);
    }
    p.x.resize((size_t)M * H);
    for (auto &v : p.x) v = f2bf((float)(2 * urand() - 1));
    if (identity) {
        p.n_slots = (M + 63) / 64 + (int)(rnd() % 2); /* an extra empty slot sometimes */
        p.used_slots = (M + 63) / 64;
        return;
    }
    p.ids.resize((size_t)M * K), p.wts.resize((size_t)M * K);
    int skip = E > 4 ? 3 : -1; /* one expert with no tokens */
    for (int t = 0; t < M; t++) {
        int got = 0;
        while (got < K) {
            int e = (int)(E * pow(urand(), 1.6)); /* uneven loads */
            if (e >= E || e == skip) continue;
            bool dup = false;
            for (int j = 0; j < got; j++) dup |= p.ids[(size_t)t * K + j] == e;
            if (dup) continue;
            p.ids[(size_t)t * K + got] = e;
            p.wts[(size_t)t * K + got] = (float)(0.1 + urand());
            got++;
        }
    }
    p.n_slots = fp4_moe_group_slots(M, K, E, 64);
    std::vector<int> cnt(E, 0);
    for (int v : p.ids) cnt[v]++;
    p.te.assign(p.n_slots, -1);
    p.rsrc.assign((size_t)p.n_slots * 64, -1);
    p.rdst.assign((size_t)p.n_slots * 64, -1);
    p.rw.assign((size_t)p.n_slots * 64, 0.f);
    std::vector<int> seg(E);
    int slots = 0;
    for (int e = 0; e < E; e++) {
        seg[e] = slots * 64;
        int ns = (cnt[e] + 63) / 64;
        for (int s = 0; s < ns; s++) p.te[slots + s] = e;
        slots += ns;
    }
    p.used_slots = slots;
    for (int pi = 0; pi < M * K; pi++) {
        int e = p.ids[pi], pos = seg[e]++;
        p.rsrc[pos] = pi / K, p.rdst[pos] = pi, p.rw[pos] = p.wts[pi];
    }
}

static double wval(const std::vector<uint8_t> &w, const std::vector<uint8_t> &s, size_t row,
                    int k, int kdim)
{
    uint8_t b = w[row * (kdim / 2) + k / 2];
    return e2m1_val(k & 1 ? b >> 4 : b & 15) * e4m3_val(s[row * (kdim / 16) + k / 16]);
}

static double act_ref(int act, double g, double u)
{
    if (act == 0) return g / (1 + exp(-g)) * u;
    g = std::min(g, 7.0);
    u = std::min(std::max(u, -7.0), 7.0);
    return (u + 1) * g / (1 + exp(-1.702 * g));
}

/* device buffers of one problem */
struct dev {
    uint8_t *w13, *s13, *w2, *s2;
    float *g13, *g2, *rw, *pairs_a, *pairs_b;
    int32_t *te, *rsrc, *rdst;
    uint16_t *x, *a1_a, *a1_b;
    size_t a1_elems, pairs_elems;
};

static uint8_t *upload_permuted(const std::vector<uint8_t> &w, size_t rows, int k)
{
    std::vector<uint8_t> t(w.size());
    for (size_t r = 0; r < rows; r++)
        fp4_mma_permute_row(&w[r * (k / 2)], &t[r * (k / 2)], k);
    uint8_t *d;
    CK(cudaMalloc(&d, t.size()));
    CK(cudaMemcpy(d, t.data(), t.size(), cudaMemcpyHostToDevice));
    return d;
}

template <class T> static T *upload(const std::vector<T> &v)
{
    T *d;
    CK(cudaMalloc(&d, v.size() * sizeof(T) + 16));
    CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static void dev_create(const problem &p, dev &d)
{
    d.w13 = upload_permuted(p.w13, (size_t)p.E * 2 * p.I, p.H);
    d.w2 = upload_permuted(p.w2, (size_t)p.E * p.H, p.I);
    d.s13 = upload(p.s13), d.s2 = upload(p.s2), d.g13 = upload(p.g13), d.g2 = upload(p.g2);
    d.x = upload(p.x);
    d.te = p.identity ? NULL : upload(p.te);
    d.rsrc = p.identity ? NULL : upload(p.rsrc);
    d.rdst = p.identity ? NULL : upload(p.rdst);
    d.rw = p.identity ? NULL : upload(p.rw);
    size_t rows1 = (size_t)p.n_slots * 64;
    d.a1_elems = rows1 * p.I;
    d.pairs_elems = (size_t)(p.identity ? p.M : p.M * p.K) * p.H;
    CK(cudaMalloc(&d.a1_a, d.a1_elems * 2));
    CK(cudaMalloc(&d.a1_b, d.a1_elems * 2));
    CK(cudaMalloc(&d.pairs_a, d.pairs_elems * 4));
    CK(cudaMalloc(&d.pairs_b, d.pairs_elems * 4));
}

static void dev_destroy(dev &d)
{
    void *ptrs[] = {d.w13, d.s13, d.w2, d.s2, d.g13, d.g2, d.rw, d.te, d.rsrc, d.rdst,
                    d.x, d.a1_a, d.a1_b, d.pairs_a, d.pairs_b};
    for (void *q : ptrs)
        if (q) cudaFree(q);
}

static fp4_mma_gemm_args fc_args(const problem &p, const dev &d, int gated, void *out,
                                 const uint16_t *a_in)
{
    fp4_mma_gemm_args a;
    memset(&a, 0, sizeof a);
    a.wfmt = FP4_MMA_W_NVFP4;
    a.act = 1, a.limit = 7.f, a.alpha = 1.702f;
    a.n_tiles_m = p.n_slots;
    a.tile_expert = d.te;
    if (gated) {
        a.gated = 1, a.n = p.I, a.k = p.H, a.a = d.x, a.a_rows = p.M, a.row_src = d.rsrc;
        a.out_rows = p.identity ? p.M : p.n_slots * 64;
        a.wq = d.w13, a.ws = d.s13, a.gscale = d.g13;
    } else {
        a.gated = 0, a.n = p.H, a.k = p.I, a.a = a_in;
        a.a_rows = p.identity ? p.M : p.n_slots * 64;
        a.row_dst = d.rdst, a.row_w = d.rw, a.out_rows = p.M;
        a.wq = d.w2, a.ws = d.s2, a.gscale = d.g2;
    }
    a.out = out;
    return a;
}

/* sum (a-b)^2, sum b^2, non-finite in a, non-finite in b over n elements */
template <class T> __device__ double as_d(T v);
template <> __device__ double as_d<float>(float v) { return v; }
template <> __device__ double as_d<uint16_t>(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }

template <class T>
__global__ void cmp_kernel(const T *a, const T *b, size_t n, double *acc, unsigned long long *bad)
{
    double d2 = 0, r2 = 0;
    unsigned long long ba = 0, bb = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double x = as_d(a[i]), y = as_d(b[i]);
        if (!isfinite(x)) { ba++; continue; }
        if (!isfinite(y)) { bb++; continue; }
        d2 += (x - y) * (x - y), r2 += y * y;
    }
    atomicAdd(&acc[0], d2), atomicAdd(&acc[1], r2);
    atomicAdd(&bad[0], ba), atomicAdd(&bad[1], bb);
}

template <class T> static void compare_dev(const char *what, const T *a, const T *b, size_t n)
{
    double *acc;
    unsigned long long *bad;
    CK(cudaMalloc(&acc, 16));
    CK(cudaMalloc(&bad, 16));
    CK(cudaMemset(acc, 0, 16));
    CK(cudaMemset(bad, 0, 16));
    cmp_kernel<T><<<1024, 256>>>(a, b, n, acc, bad);
    CK(cudaGetLastError());
    double h[2];
    unsigned long long hb[2];
    CK(cudaMemcpy(h, acc, 16, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, bad, 16, cudaMemcpyDeviceToHost));
    cudaFree(acc), cudaFree(bad);
    double rel = h[1] > 0 ? sqrt(h[0] / h[1]) : (h[0] > 0 ? 1e30 : 0);
    bool ok = hb[0] == 0 && hb[1] == 0 && rel < 1e-2 && h[1] > 0;
    if (ok) n_pass++;
    else {
        n_fail++;
        printf("FAIL: %s wgmma vs mma: rel %.3e, non-finite wgmma %llu mma %llu, n %zu\n", what,
               rel, hb[0], hb[1], n);
    }
    printf("  %-34s wgmma vs mma   rel %.3e (n %zu)\n", what, rel, n);
}

static void check_rel(const char *what, const char *who, double d2, double r2, long nonfin)
{
    double rel = r2 > 0 ? sqrt(d2 / r2) : 1e30;
    bool ok = nonfin == 0 && rel < 1e-2;
    if (ok) n_pass++;
    else {
        n_fail++;
        printf("FAIL: %s %s vs CPU fp64: rel %.3e, non-finite %ld\n", what, who, rel, nonfin);
    }
    printf("  %-34s %-5s vs CPU  rel %.3e\n", what, who, rel);
}

/* Runs FC1 and FC2 on both kernels, compares; CPU reference on n_sample rows (-1: all). */
static void check_problem(const char *name, problem &p, int n_sample)
{
    dev d;
    memset(&d, 0, sizeof d);
    dev_create(p, d);
    char what[160];
    /* FC1 */
    CK(cudaMemset(d.a1_a, 0xff, d.a1_elems * 2));
    CK(cudaMemset(d.a1_b, 0xff, d.a1_elems * 2));
    fp4_mma_gemm_args a = fc_args(p, d, 1, d.a1_a, NULL);
    CK(fp4_sm90_wgmma_gemm(&a, 0));
    a.out = d.a1_b;
    CK(fp4_mma_gemm(&a, 0));
    CK(cudaDeviceSynchronize());
    size_t rows1 = p.identity ? (size_t)p.M : (size_t)p.used_slots * 64;
    snprintf(what, sizeof what, "%s FC1", name);
    compare_dev<uint16_t>(what, d.a1_a, d.a1_b, rows1 * p.I);
    /* FC2 from the mma FC1 output */
    CK(cudaMemset(d.pairs_a, 0xff, d.pairs_elems * 4));
    CK(cudaMemset(d.pairs_b, 0xff, d.pairs_elems * 4));
    a = fc_args(p, d, 0, d.pairs_a, d.a1_b);
    CK(fp4_sm90_wgmma_gemm(&a, 0));
    a.out = d.pairs_b;
    CK(fp4_mma_gemm(&a, 0));
    CK(cudaDeviceSynchronize());
    snprintf(what, sizeof what, "%s FC2", name);
    compare_dev<float>(what, d.pairs_a, d.pairs_b, d.pairs_elems);

    /* CPU reference on rows */
    std::vector<uint16_t> h1a(d.a1_elems), h1b(d.a1_elems);
    CK(cudaMemcpy(h1a.data(), d.a1_a, d.a1_elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h1b.data(), d.a1_b, d.a1_elems * 2, cudaMemcpyDeviceToHost));
    std::vector<size_t> rows;
    for (size_t r = 0; r < rows1; r++)
        if (p.identity || p.rsrc[r] >= 0) rows.push_back(r);
    if (n_sample >= 0 && (size_t)n_sample < rows.size()) {
        for (int i = 0; i < n_sample; i++) std::swap(rows[i], rows[i + rnd() % (rows.size() - i)]);
        rows.resize(n_sample);
    }
    const int H = p.H, I = p.I;
    double d2[2] = {0, 0}, r2 = 0;
    long nf[2] = {0, 0};
    for (size_t r : rows) {
        int tok = p.identity ? (int)r : p.rsrc[r], e = p.identity ? 0 : p.te[r / 64];
        for (int c = 0; c < I; c++) {
            double gs = 0, us = 0;
            size_t gr = (size_t)e * 2 * I + c, ur = gr + I;
            for (int k = 0; k < H; k++) {
                double xv = bf2d(p.x[(size_t)tok * H + k]);
                gs += wval(p.w13, p.s13, gr, k, H) * xv;
                us += wval(p.w13, p.s13, ur, k, H) * xv;
            }
            double ref = act_ref(1, gs * p.g13[2 * e], us * p.g13[2 * e + 1]);
            double va = bf2d(h1a[r * I + c]), vb = bf2d(h1b[r * I + c]);
            nf[0] += !isfinite(va), nf[1] += !isfinite(vb);
            d2[0] += (va - ref) * (va - ref), d2[1] += (vb - ref) * (vb - ref), r2 += ref * ref;
        }
    }
    snprintf(what, sizeof what, "%s FC1 (%zu rows)", name, rows.size());
    check_rel(what, "wgmma", d2[0], r2, nf[0]);
    check_rel(what, "mma", d2[1], r2, nf[1]);

    d2[0] = d2[1] = r2 = 0, nf[0] = nf[1] = 0;
    std::vector<float> oa(H), ob(H);
    size_t n2 = 0;
    for (size_t r : rows) {
        int dst = p.identity ? (int)r : p.rdst[r], e = p.identity ? 0 : p.te[r / 64];
        if (dst < 0) continue;
        n2++;
        double f = p.g2[e] * (p.identity ? 1.0 : p.rw[r]);
        CK(cudaMemcpy(oa.data(), d.pairs_a + (size_t)dst * H, H * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(ob.data(), d.pairs_b + (size_t)dst * H, H * 4, cudaMemcpyDeviceToHost));
        for (int c = 0; c < H; c++) {
            double s = 0;
            for (int k = 0; k < I; k++)
                s += wval(p.w2, p.s2, (size_t)e * H + c, k, I) * bf2d(h1b[r * I + k]);
            double ref = s * f;
            nf[0] += !isfinite(oa[c]), nf[1] += !isfinite(ob[c]);
            d2[0] += (oa[c] - ref) * (oa[c] - ref), d2[1] += (ob[c] - ref) * (ob[c] - ref);
            r2 += ref * ref;
        }
    }
    snprintf(what, sizeof what, "%s FC2 (%zu rows)", name, n2);
    check_rel(what, "wgmma", d2[0], r2, nf[0]);
    check_rel(what, "mma", d2[1], r2, nf[1]);
    dev_destroy(d);
}

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void time_problem(problem &p, int reps)
{
    dev d;
    memset(&d, 0, sizeof d);
    dev_create(p, d);
    void *flush;
    const size_t flush_bytes = 256u << 20;
    CK(cudaMalloc(&flush, flush_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* fill FC1 output once so FC2 reads real data */
    fp4_mma_gemm_args a1 = fc_args(p, d, 1, d.a1_b, NULL);
    CK(fp4_mma_gemm(&a1, 0));
    double pairs = (double)p.M * p.K;
    double fl[2] = {2.0 * pairs * 2 * p.I * p.H, 2.0 * pairs * p.H * p.I};
    float ms[2][2];
    for (int fc = 0; fc < 2; fc++)
        for (int kern = 0; kern < 2; kern++) {
            fp4_mma_gemm_args a = fc == 0 ? fc_args(p, d, 1, d.a1_a, NULL)
                                          : fc_args(p, d, 0, d.pairs_a, d.a1_b);
            std::vector<float> t;
            for (int r = 0; r < reps + 2; r++) {
                CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, 0));
                CK(cudaEventRecord(e0, 0));
                CK(kern ? fp4_mma_gemm(&a, 0) : fp4_sm90_wgmma_gemm(&a, 0));
                CK(cudaEventRecord(e1, 0));
                CK(cudaEventSynchronize(e1));
                float x;
                CK(cudaEventElapsedTime(&x, e0, e1));
                if (r >= 2) t.push_back(x);
            }
            ms[fc][kern] = median(t);
        }
    for (int fc = 0; fc < 2; fc++)
        printf("TIME M=%-6d %s  wgmma %8.3f ms %6.1f TFLOP/s   mma %8.3f ms %6.1f TFLOP/s  "
               "speedup %.2fx\n",
               p.M, fc ? "FC2" : "FC1", ms[fc][0], fl[fc] / ms[fc][0] * 1e-9, ms[fc][1],
               fl[fc] / ms[fc][1] * 1e-9, ms[fc][1] / ms[fc][0]);
    printf("TIME M=%-6d FC1+FC2 wgmma %8.3f ms %6.1f TFLOP/s   mma %8.3f ms\n", p.M,
           ms[0][0] + ms[1][0], (fl[0] + fl[1]) / (ms[0][0] + ms[1][0]) * 1e-9,
           ms[0][1] + ms[1][1]);
    cudaFree(flush);
    dev_destroy(d);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int quick = !strcmp(mode, "--quick"), small = !strcmp(mode, "--small");
    int dev_id = 0, maj = 0, min = 0;
    if (cudaGetDevice(&dev_id) != cudaSuccess) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, dev_id);
    cudaDeviceGetAttribute(&min, cudaDevAttrComputeCapabilityMinor, dev_id);
    printf("device cc %d.%d\n", maj, min);
    if (!strcmp(mode, "--probe")) return 0;
    CK(fp4_mma_gemm_init());
    CK(fp4_sm90_wgmma_gemm_init());

    { /* edge cases: odd K tiles (192), partial FC2 column tile (192), empty expert */
        problem p;
        make_problem(p, 8, 192, 64, 37, 2, 0);
        check_problem("small E8 H192 I64 M37 k2", p, -1);
    }
    {
        problem p;
        make_problem(p, 16, 320, 128, 300, 4, 0);
        check_problem("small E16 H320 I128 M300 k4", p, -1);
    }
    {
        problem p; /* one expert takes many slots: 128-token units and a lone slot */
        make_problem(p, 2, 256, 64, 333, 2, 0);
        check_problem("small E2 H256 I64 M333 k2", p, -1);
    }
    for (int m : {100, 130, 64}) { /* identity rows (shared expert) */
        problem p;
        make_problem(p, 1, 384, 192, m, 1, 1);
        char nm[64];
        snprintf(nm, sizeof nm, "identity M%d", m);
        check_problem(nm, p, -1);
    }
    const int ms[3] = {512, 4096, 16384};
    for (int i = 0; i < (small ? 0 : quick ? 1 : 3); i++) {
        problem p;
        make_problem(p, 128, 6144, 384, ms[i], 8, 0);
        char nm[64];
        snprintf(nm, sizeof nm, "tp8 M%d", ms[i]);
        check_problem(nm, p, 16);
        time_problem(p, 10);
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
