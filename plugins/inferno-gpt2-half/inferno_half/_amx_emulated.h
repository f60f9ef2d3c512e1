/* AMX's tile instructions in plain C, for testing the AMX paths of _kernels.c on a CPU without AMX.

   Built only by the tests (tests/amx_emulated.py compiles _kernels.c with -DINFERNO_HALF_EMULATE_AMX into
   a module of its own, _kernels_amx_emulated); the installed kernels never include this file. Each
   intrinsic the kernels use is replaced by a function that does what Intel's SDM pseudo-code says the
   instruction does, on eight tiles of a thread's own (tile state is per thread, as in hardware):

   - ldtilecfg (palette 1): each tile's rows and bytes a row; tileloadd: the rows and bytes configured,
     the rest of the tile zero; tilestored: the rows and bytes configured; tilezero; tilerelease;
   - TDPBSSD: C[m][n] += sum over k, i < 4 of A[m][4k + i] * B[k][4n + i], int8 by int8 into int32
     (exact, wrapping);
   - TDPBF16PS: C[m][n] += A[m][2k] * B[k][2n], then += A[m][2k + 1] * B[k][2n + 1], in float32 (each
     product of two bfloat16 is exact in float32; each add rounds to nearest even).

   So the emulated build checks the AMX paths' layouts, edges and arithmetic on every AVX-512 machine;
   only the real instructions' speed (and TDPBF16PS's own rounding of its two adds, which Intel leaves
   to the implementation) need a CPU with AMX. */
#include <string.h>

static __thread struct {
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t data[8][16][64];
} emu_tiles;

static void emu_tile_loadconfig(const void *config) {
    const uint8_t *c = (const uint8_t *)config;
    for (int t = 0; t < 8; t++) {
        memcpy(&emu_tiles.colsb[t], c + 16 + 2 * t, 2);
        emu_tiles.rows[t] = c[48 + t];
    }
    memset(emu_tiles.data, 0, sizeof emu_tiles.data);
}

static void emu_tile_loadd(int t, const void *base, long stride) {
    memset(emu_tiles.data[t], 0, sizeof emu_tiles.data[t]);
    for (int r = 0; r < emu_tiles.rows[t]; r++)
        memcpy(emu_tiles.data[t][r], (const char *)base + r * stride, emu_tiles.colsb[t]);
}

static void emu_tile_stored(int t, void *base, long stride) {
    for (int r = 0; r < emu_tiles.rows[t]; r++)
        memcpy((char *)base + r * stride, emu_tiles.data[t][r], emu_tiles.colsb[t]);
}

static void emu_tile_zero(int t) { memset(emu_tiles.data[t], 0, sizeof emu_tiles.data[t]); }

/* The two dot products (and emu_bf16) read and write only the thread's own tiles: the loads and stores
   above are what touch the kernels' memory. So the sanitized build (tests/amx_kernels.py,
   INFERNO_HALF_SANITIZE=1, -O1) leaves them unchecked and optimized as the plain build (checked at -O1,
   they took most of its time), with fp-contract=off as the build's. */
#if defined(__GNUC__)
#define EMU_UNCHECKED __attribute__((no_sanitize("address", "undefined"), optimize("O2", "fp-contract=off")))
#else
#define EMU_UNCHECKED
#endif

EMU_UNCHECKED static void emu_tile_dpbssd(int c, int a, int b) {
    for (int m = 0; m < emu_tiles.rows[c]; m++) {
        int32_t *out = (int32_t *)emu_tiles.data[c][m];
        const int8_t *x = (const int8_t *)emu_tiles.data[a][m];
        for (int k = 0; k < emu_tiles.colsb[a] / 4; k++) {
            const int8_t *w = (const int8_t *)emu_tiles.data[b][k];
            for (int n = 0; n < emu_tiles.colsb[c] / 4; n++) {
                int32_t s = 0;
                for (int i = 0; i < 4; i++) s += (int32_t)x[4 * k + i] * w[4 * n + i];
                out[n] = (int32_t)((uint32_t)out[n] + (uint32_t)s);
            }
        }
    }
}

EMU_UNCHECKED static inline float emu_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

EMU_UNCHECKED static void emu_tile_dpbf16ps(int c, int a, int b) {
    for (int m = 0; m < emu_tiles.rows[c]; m++) {
        float *out = (float *)emu_tiles.data[c][m];
        const uint16_t *x = (const uint16_t *)emu_tiles.data[a][m];
        for (int k = 0; k < emu_tiles.colsb[a] / 4; k++) {
            const uint16_t *w = (const uint16_t *)emu_tiles.data[b][k];
            for (int n = 0; n < emu_tiles.colsb[c] / 4; n++) {
                out[n] += emu_bf16(x[2 * k]) * emu_bf16(w[2 * n]);
                out[n] += emu_bf16(x[2 * k + 1]) * emu_bf16(w[2 * n + 1]);
            }
        }
    }
}

#undef _tile_loadconfig
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_release
#undef _tile_dpbssd
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) emu_tile_loadconfig(config)
#define _tile_loadd(t, base, stride) emu_tile_loadd(t, base, (long)(stride))
#define _tile_stored(t, base, stride) emu_tile_stored(t, base, (long)(stride))
#define _tile_zero(t) emu_tile_zero(t)
#define _tile_release() ((void)0)
#define _tile_dpbssd(c, a, b) emu_tile_dpbssd(c, a, b)
#define _tile_dpbf16ps(c, a, b) emu_tile_dpbf16ps(c, a, b)
