/* What bounds the AMX int8 tiles (#44): 32 rows by a panel (2 x 2 tiles) over k, three ways, one thread.

     t22     one TDPBSSD per block of 32 inputs (the block path's depth), the sums stored per block,
             no arithmetic after: the tiles' own rate at that depth
     t22f    the same, and each block's 16 x 16 sums converted and added with their scale (the block
             path's AVX-512 work, accumulators in memory for the 4 tiles)
     t22acc  one scale per row (inputs=rows): K = 64 a TDPBSSD, the sums accumulated in the tiles
             over all of k and stored once

   Build and run (x86-64 Linux, GCC 11+, a CPU with AMX; the include pulls in the plugin's kernels):

     gcc -O3 -ffp-contract=off -fopenmp $(python3-config --includes) benches/amx_tile_depth.c \
         -o /tmp/amx_tile_depth $(python3-config --ldflags --embed) && /tmp/amx_tile_depth 768 2304 96

   Arguments: k n m (default 768 2304 96: c_attn's product of one 96-row chunk). Prints GOP/s (2 m k n
   over the best of 20 runs). Speeds only: the weights and inputs are random bytes. */
#include "../plugins/inferno-gpt2-half/inferno_half/_kernels.c"
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static const struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; }
__attribute__((aligned(64))) CFG22 = {1, 0, {0}, {QB, QB, 64, 64, 64, 64, 64, 64}, {16, 16, QB/4, QB/4, 16, 16, 16, 16}},
CFG22K64 = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
#define ST(T, s) AMX_STORE(T, s)
/* 32 rows x 32 outputs (one panel), tiles only, K=32 blocks */
XAMX static void t22(const int8_t *q, int64_t kp, int64_t kb, const int8_t *w, int32_t *s) {
    for (int64_t blk = 0; blk < kb; blk++) {
        _tile_loadd(0, q + blk * QB, kp); _tile_loadd(1, q + 16 * kp + blk * QB, kp);
        _tile_loadd(2, w + blk * 8 * 128, 128); _tile_loadd(3, w + blk * 8 * 128 + 64, 128);
        _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
        _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3);
        ST(4, s); ST(5, s + 256); ST(6, s + 512); ST(7, s + 768);
    }
}
/* same + FMAs into memory accumulators acc[4][16][16] floats */
XAMX static void t22f(const int8_t *q, int64_t kp, int64_t kb, const int8_t *w, int32_t *s, float *acc, const float *d) {
    for (int64_t blk = 0; blk < kb; blk++) {
        _tile_loadd(0, q + blk * QB, kp); _tile_loadd(1, q + 16 * kp + blk * QB, kp);
        _tile_loadd(2, w + blk * 8 * 128, 128); _tile_loadd(3, w + blk * 8 * 128 + 64, 128);
        _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
        _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3);
        int32_t *sb = s + (blk & 1) * 1024;
        ST(4, sb); ST(5, sb + 256); ST(6, sb + 512); ST(7, sb + 768);
        if (blk) {
            int32_t *sp = s + ((blk - 1) & 1) * 1024; const float *dp = d + (blk - 1) * 32;
            for (int c = 0; c < 4; c++)
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++) {
                    float *a = acc + c * 256 + r * 16;
                    _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sp + c * 256 + r * 16)), _mm512_set1_ps(dp[(c >> 1) * 16 + r]), _mm512_load_ps(a)));
                }
        }
    }
}
/* K=64 full accumulate in tiles (per-row scale arithmetic) */
XAMX static void t22acc(const int8_t *q, int64_t kp, int64_t kb, const int8_t *w, int32_t *s) {
    _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    for (int64_t blk = 0; blk < kb; blk += 2) {
        _tile_loadd(0, q + blk * QB, kp); _tile_loadd(1, q + 16 * kp + blk * QB, kp);
        _tile_loadd(2, w + blk * 8 * 128, 128); _tile_loadd(3, w + blk * 8 * 128 + 64, 128);
        _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3);
    }
    ST(4, s); ST(5, s + 256); ST(6, s + 512); ST(7, s + 768);
}
XAMX int main(int argc, char **argv) {
    int64_t m = 96, k = 768, n = 2304;
    if (argc > 1) k = atoll(argv[1]);
    if (argc > 2) n = atoll(argv[2]);
    if (argc > 3) m = atoll(argv[3]);
    amx_support();
    int64_t kp = kpad(k), kb = kp / QB, gs = panel_elems(k, FMT_I8), np = n / PANEL;
    int8_t *q = aligned_alloc(64, m * kp); float *d = aligned_alloc(64, 4 * m * kb);
    int8_t *w = aligned_alloc(64, np * gs);
    int32_t *s = aligned_alloc(64, 8192 * 4); float *acc = aligned_alloc(64, 4096 * 4);
    for (int64_t i = 0; i < m * kp; i++) q[i] = (int8_t)(rand() % 255 - 127);
    for (int64_t i = 0; i < m * kb; i++) d[i] = 0.01f;
    for (int64_t i = 0; i < np * gs; i++) w[i] = (int8_t)(rand() % 255 - 127);
    for (int v = 0; v < 3; v++) {
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now();
            _tile_loadconfig(v == 2 ? (const void *)&CFG22K64 : (const void *)&CFG22);
            for (int64_t r0 = 0; r0 < m; r0 += 32)
                for (int64_t p = 0; p < np; p++) {
                    if (v == 0) t22(q + r0 * kp, kp, kb, w + p * gs, s);
                    else if (v == 1) t22f(q + r0 * kp, kp, kb, w + p * gs, s, acc, d + r0 * kb);
                    else t22acc(q + r0 * kp, kp, kb, w + p * gs, s);
                }
            _tile_release();
            double t = now() - t0; if (t < best) best = t;
        }
        double macs = (double)m * k * n;
        printf("%-8s %.3f ms  %.0f GOP/s\n", (const char *[]){"t22", "t22f", "t22acc"}[v], best * 1e3, 2 * macs / best / 1e9);
    }
    return 0;
}
