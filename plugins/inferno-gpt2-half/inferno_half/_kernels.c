/* inferno-gpt2-half's compiled kernels: matrix products with 16-bit weights and float32 everything else.

   y[m, j] = b[j] + sum_k x[m, k] * w[j, k]      x: float32 [M, K], w: 16-bit [N, K] (row j = output j),
                                                  b: float32 [N] or NULL, y: float32 [M, N]

   w is stored in panels, as packed once at load by inferno_half.backend.pack: N padded with zeros to a
   multiple of PANEL (32), then [N/32][K][32]: panel p holds outputs 32p .. 32p + 31, and for each input k
   their 32 weights side by side (64 bytes, one cache line). The kernel reads a panel strictly in order.

   The product is an outer product, register-blocked: for each k, the 32 weights of a panel are widened
   to float32 once (two AVX-512 vectors) and multiplied into up to MR_MAX rows of x at once (each x[m, k]
   broadcast), so a step of many sequences reads and widens every weight once per tile of rows rather
   than once per row, and its cost is the FMAs, not the unpacking. One row alone is bound by how fast the
   weights stream from memory; it takes several panels at a time (independent FMA chains, a few memory
   streams). Each output's sum runs over k in order, one FMA chain from zero, the bias added after: the
   same arithmetic for any number of rows and on either SIMD path, so a row of a batch gets the bits it
   gets alone. Only the weights are rounded; activations and sums stay float32.

   Paths, chosen at run time by CPU feature: AVX-512F (x86-64-v4), AVX2 + FMA + F16C, portable C.
   The panels are split among OpenMP threads where the compiler supports OpenMP.

   Two 16-bit weight formats: IEEE float16 (FMT_F16) and bfloat16 (FMT_BF16, the top half of a float32);
   int8 weights (FMT_I8) and 4-bit ones (FMT_Q4) multiply int8-quantized inputs instead, see "int8
   products" below and "4-bit products" (_kernels_q4.h); bfloat16 weights in input pairs (FMT_BF16P)
   multiply inputs rounded to bfloat16, see "bfloat16 inputs".
   Python calls the kernels through the functions at the end of this file, which take NumPy arrays. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define FMT_F16 0
#define FMT_BF16 1
#define FMT_I8 2   /* int8, one float32 scale per output (see panel_elems and "int8 products") */
#define FMT_Q4 3   /* 4-bit, a float16 scale per block of 32 inputs (see "4-bit products", _kernels_q4.h) */
/* bfloat16 weights whose panels hold each output's inputs in pairs ([kpad / 2][32][2]: the operand of
   VDPBF16PS and of AMX-BF16's tiles, so a product reads them as they lie), for products whose inputs
   are rounded to bfloat16 too (the backend's inputs=bfloat16; see "bfloat16 inputs"). */
#define FMT_BF16P 4
/* A flag on FMT_I8 for the products: the inputs quantized with one scale per row, not per block of QB
   (see "int8 products"). The weights are the same. */
#define FMT_ROWS 16
/* A flag on the format of self_attention: a long prompt's attention on AMX-BF16 tiles where the CPU has
   them (see "attention on AMX-BF16 tiles"). */
#define FMT_ATT16 32

#define PANEL 32   /* outputs per panel */
#define TASK 4     /* panels per thread task: 128 outputs */
#define MR_MAX 12  /* rows per register tile over a whole panel (AVX-512: 12 x 2 accumulators) */
#define MR_HALF 24 /* rows per AVX-512 tile over half a panel (24 accumulators) */
#define MC 96      /* rows per pass over the weights: x's chunk stays in L2 while the panels go by */

#define PATH_PORTABLE 0
#define PATH_AVX2 1
#define PATH_AVX512 2

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ------------------------------------------------------------------------------------ portable C */

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);            /* inf, nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);     /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;                                         /* zero */
    } else {                                                 /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float widen(uint16_t h, int fmt) { return fmt == FMT_F16 ? f16_to_f32(h) : bf16_to_f32(h); }

/* float32 to float16, rounded to nearest even as VCVTPS2PH and NumPy's astype round (F. Giesen's
   float_to_half_fast3_rtne): |f| >= 65520 becomes inf, NaN a quiet NaN. */
static uint16_t f32_to_f16(float f) {
    uint32_t x, sign;
    memcpy(&x, &f, 4);
    sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= 0x47800000u) {              /* 65536 or more, inf, NaN */
        o = x > 0x7f800000u ? 0x7e00 : 0x7c00;
    } else if (x < 0x38800000u) {        /* below 2^-14: a subnormal half (or zero), rounded by an add */
        float a, magic = 0.5f;
        uint32_t mb;
        memcpy(&a, &x, 4);
        a += magic;
        memcpy(&x, &a, 4);
        memcpy(&mb, &magic, 4);
        o = (uint16_t)(x - mb);
    } else {                             /* normal: rebias, round the 13 dropped bits to nearest even */
        x += ((uint32_t)(15 - 127) << 23) + 0xfff + ((x >> 13) & 1);
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* A KV cache holds float32, or float16 (the option kv=float16: half the bytes a decode step reads);
   h16 says which. Element i of a cache row, widened. */
static inline float kv_at(const void *p, int64_t i, int h16) {
    return h16 ? f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* int8 products quantize the inputs in blocks of QB along k (see "int8 products"). */
#define QB 32

/* k rounded up to whole blocks of QB: the inputs an int8 panel holds (the padding zero). */
static inline int64_t kpad(int64_t k) { return (k + QB - 1) / QB * QB; }

/* Weights are addressed by element: 2 bytes in the 16-bit formats, 1 in int8. An int8 panel holds
   kpad(k) inputs in groups of 4 ([kpad / 4][32 outputs][4 inputs]: the operand layout of VNNI's
   vpdpbusd, 4 inputs of one output in each 32-bit lane), then its 32 outputs' float32 scales (128 bytes:
   4 more rows of 32). */
#define Q4_BLOCK (QB * PANEL / 2 + 2 * PANEL) /* a q4 panel's bytes per block of QB inputs: see _kernels_q4.h */
static inline int64_t panel_elems(int64_t k, int fmt) {
    return fmt == FMT_I8 ? (kpad(k) + 4) * PANEL : fmt == FMT_Q4 ? kpad(k) / QB * Q4_BLOCK
         : fmt == FMT_BF16P ? kpad(k) * PANEL : k * PANEL;
}
/* Whether a format's elements are bytes (int8, q4) rather than 16-bit values. */
#define BYTES(fmt) ((fmt) == FMT_I8 || (fmt) == FMT_Q4)
#define AT(w, e, fmt) ((const char *)(w) + (e) * (BYTES(fmt) ? 1 : 2))
#define PAN(w, e, fmt) ((const uint16_t *)AT(w, e, fmt))

/* Where input i of output j (0 .. 31) of panel p sits, in elements. */
static inline int64_t elem_at(int64_t p, int64_t i, int64_t j, int64_t k, int fmt) {
    if (fmt == FMT_I8) return p * panel_elems(k, fmt) + (i >> 2) * 4 * PANEL + j * 4 + (i & 3);
    if (fmt == FMT_BF16P) return p * panel_elems(k, fmt) + (i >> 1) * 2 * PANEL + j * 2 + (i & 1);
    return p * panel_elems(k, fmt) + i * PANEL + j;
}

/* Element e widened to float32 (an int8 one unscaled). */
static inline float widen_at(const uint16_t *w, int64_t e, int fmt) {
    return fmt == FMT_I8 ? (float)((const int8_t *)w)[e] : widen(w[e], fmt);
}

/* The scales of panel p of an int8 weight over k inputs. */
static inline const float *scales_of(const uint16_t *w, int64_t p, int64_t k) {
    return (const float *)AT(w, p * panel_elems(k, FMT_I8) + kpad(k) * PANEL, FMT_I8);
}

/* GPT-2's tanh GELU as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same function, since
   (1 + tanh(u)) / 2 = 1 / (1 + e^(-2u)). */
static float gelu_new(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

/* Inputs widened per chunk on the portable path (32 KB of floats on the stack). */
#define PORTABLE_KC 256

/* Panels p0 .. p1 - 1 for every row of x [m, k] (m <= MC), portable C: each chunk of a panel is widened
   once into a buffer, then serves every row (sums in k order, as the SIMD paths, without FMA). */
static void panels_portable(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t p0, int64_t p1,
                            const float *b, float *y, int64_t n, int fmt, int act) {
    float buf[PORTABLE_KC * PANEL], acc[MC][PANEL];
    for (int64_t p = p0; p < p1; p++) {
        int64_t pe = p * panel_elems(k, fmt);
        memset(acc, 0, sizeof(float) * PANEL * (size_t)m);
        for (int64_t i0 = 0; i0 < k; i0 += PORTABLE_KC) {
            int64_t kc = min64(PORTABLE_KC, k - i0);
            for (int64_t i = 0; i < kc * PANEL; i++) buf[i] = widen_at(w, pe + i0 * PANEL + i, fmt);
            for (int64_t r = 0; r < m; r++) {
                const float *xr = x + r * k + i0;
                float *a = acc[r];
                for (int64_t i = 0; i < kc; i++) {
                    float xv = xr[i];
                    for (int j = 0; j < PANEL; j++) a[j] += xv * buf[i * PANEL + j];
                }
            }
        }
        int64_t j0 = p * PANEL, cols = min64(PANEL, n - j0);
        for (int64_t r = 0; r < m; r++)
            for (int64_t j = 0; j < cols; j++) {
                float v = acc[r][j] + (b ? b[j0 + j] : 0.0f);
                y[r * n + j0 + j] = act ? gelu_new(v) : v;
            }
    }
}

/* --------------------------------------------------------------------------------- x86 SIMD paths */

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_X86 1
#include <cpuid.h>
#include <immintrin.h>

#define X86 __attribute__((target("avx2,fma,f16c")))
#define X512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))
#ifndef PREFETCH
#define PREFETCH 2048 /* weights (2 bytes each): 4 KB ahead of each panel's stream */
#endif

X86 static INLINE __m256 load8(const uint16_t *w, int64_t e, int fmt) {
    __m128i h = _mm_loadu_si128((const __m128i *)(w + e));
    if (fmt == FMT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

X86 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The largest of v's 8 lanes (the same whatever the order: max is exact). */
X86 static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* The lanes below `left` (clamped to 0..8): the mask for masked loads and stores at a row's end. */
X86 static inline __m256i keep8(int64_t left) {
    int n = left < 0 ? 0 : left > 8 ? 8 : (int)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* e^x, 8 at a time: Cephes' expf (range reduction by ln 2, a degree-6 polynomial; within 2 ulp of expf)
   for x in [-87, 88]; x is clamped to that range, where e^x stays a normal float32. */
X86 static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

/* A softmax's exponentials in place: s[j] = e^(s[j] - m) for j < n, 8 at a time (expf for the rest);
   returns their sum. */
X86 static inline float exp_sum8(float *s, int64_t n, float m) {
    int64_t j = 0;
    __m256 vm = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        vs = _mm256_add_ps(vs, e);
    }
    float sum = hsum(vs);
    for (; j < n; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
    return sum;
}

/* gelu_new of 8 values (see the portable gelu_new). */
X86 static inline __m256 gelu8(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.7978845608028654f),
                             _mm256_fmadd_ps(x3, _mm256_set1_ps(0.044715f), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(u)));
}

/* The end of a tile: 8 sums of row r (outputs col .. col + 7) + bias (then gelu_new), the outputs
   beyond n left out. Lane-wise the same operations on both paths, so their results agree. */
X86 static INLINE void finish8(__m256 acc, const float *b, float *yr, int64_t col, int64_t n, int act) {
    if (col >= n) return;
    float t[8];
    _mm256_storeu_ps(t, acc);
    int64_t valid = min64(8, n - col);
    if (b)
        for (int64_t j = 0; j < valid; j++) t[j] += b[col + j];
    if (act) _mm256_storeu_ps(t, gelu8(_mm256_loadu_ps(t)));
    if (valid == 8) { _mm256_storeu_ps(yr + col, _mm256_loadu_ps(t)); return; }
    for (int64_t j = 0; j < valid; j++) yr[col + j] = t[j];
}

/* AVX2 tile: `mr` rows of x times `g` consecutive panels (or, with nh = 2, the half `h0` of one panel),
   8 outputs a vector: mr * g * nh accumulators (at most 12 of the 16 registers). */
X86 static INLINE void tile256(const float *x, int64_t k, const uint16_t *w, int64_t gs, const int mr,
                               const int g, const int h0, const int nh, const int fmt, const float *b,
                               float *y, int64_t n, int64_t col0, int act) {
    __m256 acc[6][2][4];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int gg = 0; gg < g; gg++)
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) acc[r][gg][h] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        int64_t e = i * PANEL;
#pragma GCC unroll 2
        for (int gg = 0; gg < g; gg++) _mm_prefetch(AT(w, e + gg * gs, fmt) + 2 * PREFETCH, _MM_HINT_T0);
        if (mr == 1) {  /* each weight vector loaded where it is used: one live at a time */
#pragma GCC unroll 2
            for (int gg = 0; gg < g; gg++)
#pragma GCC unroll 4
                for (int h = 0; h < nh; h++)
                    acc[0][gg][h] = _mm256_fmadd_ps(load8(w, e + gg * gs + (h0 + h) * 8, fmt),
                                                    _mm256_set1_ps(x[i]), acc[0][gg][h]);
            continue;
        }
        /* Several rows: the weight vectors loaded once, then a row at a time, its input broadcast once
           for all its accumulators. (Weight vector by weight vector, the mr broadcasts stayed live
           beside a 6-row tile's 12 accumulators and spilled three of them to the stack: half the
           speed.) */
        __m256 wv[2][4];
#pragma GCC unroll 2
        for (int gg = 0; gg < g; gg++)
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) wv[gg][h] = load8(w, e + gg * gs + (h0 + h) * 8, fmt);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m256 xr = _mm256_set1_ps(x[i * mr + r]);
#pragma GCC unroll 2
            for (int gg = 0; gg < g; gg++)
#pragma GCC unroll 4
                for (int h = 0; h < nh; h++) acc[r][gg][h] = _mm256_fmadd_ps(wv[gg][h], xr, acc[r][gg][h]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int gg = 0; gg < g; gg++)
            for (int h = 0; h < nh; h++)
                finish8(acc[r][gg][h], b, y + r * n, col0 + gg * PANEL + (h0 + h) * 8, n, act);
}

#define ARGS256 const float *x, int64_t k, const uint16_t *w, int64_t gs, const float *b, float *y, int64_t n, \
                int64_t col0, int act
#define PASS256 x, k, w, gs
#define T256(MR, G, H0, NH) \
    X86 static void t256_##MR##_##G##_##H0##_##NH(ARGS256, int fmt) { \
        if (fmt == FMT_F16) tile256(PASS256, MR, G, H0, NH, FMT_F16, b, y, n, col0, act); \
        else tile256(PASS256, MR, G, H0, NH, FMT_BF16, b, y, n, col0, act); }
T256(1, 1, 0, 4) T256(1, 2, 0, 4) T256(2, 1, 0, 4)
T256(1, 1, 0, 2) T256(2, 1, 0, 2) T256(3, 1, 0, 2) T256(4, 1, 0, 2) T256(5, 1, 0, 2) T256(6, 1, 0, 2)
T256(1, 1, 2, 2) T256(2, 1, 2, 2) T256(3, 1, 2, 2) T256(4, 1, 2, 2) T256(5, 1, 2, 2) T256(6, 1, 2, 2)

typedef void (*tile256_fn)(ARGS256, int fmt);
static const tile256_fn HALF256[2][7] = {
    {NULL, t256_1_1_0_2, t256_2_1_0_2, t256_3_1_0_2, t256_4_1_0_2, t256_5_1_0_2, t256_6_1_0_2},
    {NULL, t256_1_1_2_2, t256_2_1_2_2, t256_3_1_2_2, t256_4_1_2_2, t256_5_1_2_2, t256_6_1_2_2}};

/* Panels p0 .. p1 - 1 for every row of x [m, k], AVX2: one row takes two panels at a time (8 chains);
   two rows one whole panel; more, tiles of up to 6 rows over half a panel (the classic 6 x 16 tile). */
X86 static void panels_avx2(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t p0, int64_t p1,
                            const float *b, float *y, int64_t n, int fmt, int act, const int64_t *sizes,
                            int64_t tiles) {
    int64_t gs = panel_elems(k, fmt);
    for (int64_t p = p0; p < p1;) {
        const uint16_t *wp = PAN(w, p * gs, fmt);
        if (m == 1 && p + 1 < p1) { t256_1_2_0_4(x, k, wp, gs, b, y, n, p * PANEL, act, fmt); p += 2; continue; }
        if (m == 1) { t256_1_1_0_4(x, k, wp, gs, b, y, n, p * PANEL, act, fmt); p++; continue; }
        if (m == 2) { t256_2_1_0_4(x, k, wp, gs, b, y, n, p * PANEL, act, fmt); p++; continue; }
        for (int half = 0; half < 2; half++)
            for (int64_t t = 0, r0 = 0; t < tiles; r0 += sizes[t], t++)
                HALF256[half][sizes[t]](x + r0 * k, k, wp, gs, b, y + r0 * n, n, p * PANEL, act, fmt);
        p++;
    }
}

/* ----------------------------------------------------------------------------------------- AVX-512 */

X512 static INLINE __m512 load16(const uint16_t *w, int64_t e, int fmt) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(w + e));
    if (fmt == FMT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* AVX-512 tile: `mr` rows of x times `g` consecutive panels, 16 outputs a vector: mr * g * 2
   accumulators (at most 24 of the 32 registers). The end goes through finish8, as on the AVX2 path. */
X512 static INLINE void tile512(const float *x, int64_t k, const uint16_t *w, int64_t gs, const int mr,
                                const int g, const int fmt, const float *b, float *y, int64_t n, int64_t col0,
                                int act) {
    __m512 acc[MR_MAX][4][2];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int gg = 0; gg < g; gg++) acc[r][gg][0] = acc[r][gg][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        int64_t e = i * PANEL;
#pragma GCC unroll 4
        for (int gg = 0; gg < g; gg++) {
            _mm_prefetch(AT(w, e + gg * gs, fmt) + 2 * PREFETCH, _MM_HINT_T0);
            __m512 w0 = load16(w, e + gg * gs, fmt), w1 = load16(w, e + gg * gs + 16, fmt);
#pragma GCC unroll 12
            for (int r = 0; r < mr; r++) {
                __m512 xv = _mm512_set1_ps(x[i * mr + r]);
                acc[r][gg][0] = _mm512_fmadd_ps(w0, xv, acc[r][gg][0]);
                acc[r][gg][1] = _mm512_fmadd_ps(w1, xv, acc[r][gg][1]);
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int gg = 0; gg < g; gg++)
            for (int h = 0; h < 2; h++) {
                int64_t col = col0 + gg * PANEL + h * 16;
                finish8(_mm512_castps512_ps256(acc[r][gg][h]), b, y + r * n, col, n, act);
                finish8(_mm512_extractf32x8_ps(acc[r][gg][h], 1), b, y + r * n, col + 8, n, act);
            }
}

#define T512(MR, G) \
    X512 static void t512_##MR##_##G(ARGS256, int fmt) { \
        if (fmt == FMT_F16) tile512(PASS256, MR, G, FMT_F16, b, y, n, col0, act); \
        else tile512(PASS256, MR, G, FMT_BF16, b, y, n, col0, act); }
T512(1, 1) T512(1, 2) T512(1, 3) T512(1, 4) T512(2, 1) T512(2, 2) T512(3, 1) T512(3, 2)
T512(4, 1) T512(5, 1) T512(6, 1) T512(7, 1) T512(8, 1) T512(9, 1) T512(10, 1) T512(11, 1) T512(12, 1)

static const tile256_fn ROWS512[MR_MAX + 1] = {NULL, t512_1_1, t512_2_1, t512_3_1, t512_4_1, t512_5_1,
    t512_6_1, t512_7_1, t512_8_1, t512_9_1, t512_10_1, t512_11_1, t512_12_1};
static const tile256_fn WIDE512[4][5] = {{NULL}, {NULL, t512_1_1, t512_1_2, t512_1_3, t512_1_4},
                                         {NULL, t512_2_1, t512_2_2}, {NULL, t512_3_1, t512_3_2}};

/* AVX-512 tile over half a panel (16 outputs, h0 = 0 or 1) for `mr` rows, up to MR_HALF: one widening
   per input serves mr FMAs (24 rows: 24 FMAs per conversion, against 12 on a whole panel). */
X512 static INLINE void tile512h(const float *x, int64_t k, const uint16_t *w, const int mr, const int h0,
                                 const int fmt, const float *b, float *y, int64_t n, int64_t col0, int act) {
    __m512 acc[MR_HALF];
#pragma GCC unroll 24
    for (int r = 0; r < mr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        int64_t e = i * PANEL + h0 * 16;
        if (h0 == 0) _mm_prefetch(AT(w, e, fmt) + 2 * PREFETCH, _MM_HINT_T0);
        __m512 wv = load16(w, e, fmt);
#pragma GCC unroll 24
        for (int r = 0; r < mr; r++) acc[r] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x[i * mr + r]), acc[r]);
    }
    int64_t col = col0 + h0 * 16;
    for (int r = 0; r < mr; r++) {
        finish8(_mm512_castps512_ps256(acc[r]), b, y + r * n, col, n, act);
        finish8(_mm512_extractf32x8_ps(acc[r], 1), b, y + r * n, col + 8, n, act);
    }
}

#define T512H(MR) \
    X512 static void t512h_##MR(ARGS256, int fmt) { (void)gs; \
        if (fmt == FMT_F16) { tile512h(x, k, w, MR, 0, FMT_F16, b, y, n, col0, act); \
                              tile512h(x, k, w, MR, 1, FMT_F16, b, y, n, col0, act); } \
        else { tile512h(x, k, w, MR, 0, FMT_BF16, b, y, n, col0, act); \
               tile512h(x, k, w, MR, 1, FMT_BF16, b, y, n, col0, act); } }
T512H(13) T512H(14) T512H(15) T512H(16) T512H(17) T512H(18) T512H(19) T512H(20) T512H(21) T512H(22)
T512H(23) T512H(24)
static const tile256_fn HALF512[MR_HALF + 1] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, t512h_13, t512h_14, t512h_15, t512h_16, t512h_17, t512h_18, t512h_19, t512h_20,
    t512h_21, t512h_22, t512h_23, t512h_24};

/* Panels p0 .. p1 - 1 for every row of x [m, k], AVX-512: one row takes four panels at a time (8 FMA
   chains, 4 streams), two or three rows two panels; up to MR_MAX rows one whole panel; more, balanced
   tiles of up to MR_HALF rows, those over MR_MAX over each half of a panel. */
X512 static void panels_avx512(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t p0,
                               int64_t p1, const float *b, float *y, int64_t n, int fmt, int act,
                               const int64_t *sizes, int64_t tiles) {
    int64_t gs = panel_elems(k, fmt);
    if (m <= 3) {
        int64_t most = m == 1 ? 4 : 2;
        for (int64_t p = p0; p < p1;) {
            int64_t g = min64(most, p1 - p);
            WIDE512[m][g](x, k, PAN(w, p * gs, fmt), gs, b, y, n, p * PANEL, act, fmt);
            p += g;
        }
        return;
    }
    for (int64_t p = p0; p < p1; p++)
        for (int64_t t = 0, r0 = 0; t < tiles; r0 += sizes[t], t++) {
            const tile256_fn f = sizes[t] <= MR_MAX ? ROWS512[sizes[t]] : HALF512[sizes[t]];
            f(x + r0 * k, k, PAN(w, p * gs, fmt), gs, b, y + r0 * n, n, p * PANEL, act, fmt);
        }
}

/* The 32 weights of one input of a panel, widened. */
X86 static void widen32_x86(const uint16_t *src, float *out, int fmt) {
    for (int j = 0; j < PANEL; j += 8) _mm256_storeu_ps(out + j, load8(src, j, fmt));
}

/* The end of an int8 product, for outputs j0 .. j1 - 1 of `rows` rows of y: times the scales, + bias,
   then gelu_new with act (the tiles ran without bias or act). As finish8, lane for lane: one FMA
   y * scale + bias (+ 0 without a bias), 8 at a time. j0 is a panel's first output, so 8 outputs never
   straddle two panels (whose scales lie apart); masked loads and stores at the end of a row. */
X86 static void finish_i8_x86(const uint16_t *w, int64_t k, float *y, int64_t rows, int64_t n, int64_t j0,
                              int64_t j1, const float *b, int act, int scaled) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = j0; j < j1; j += 8) {
            __m256i keep = keep8(j1 - j);
            __m256 s = scaled ? _mm256_loadu_ps(scales_of(w, j / PANEL, k) + j % PANEL) : _mm256_set1_ps(1.0f);
            __m256 bv = b ? _mm256_maskload_ps(b + j, keep) : _mm256_setzero_ps();
            float *yr = y + r * n + j;
            __m256 v = _mm256_fmadd_ps(_mm256_maskload_ps(yr, keep), s, bv);
            if (act) v = gelu8(v);
            _mm256_maskstore_ps(yr, keep, v);
        }
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* CPUID leaf 7's registers {eax, ebx, ecx, edx} of subleaf `sub` (0 or 1; all zero where the CPU has no
   leaf 7), asked once per process: the features GCC's __builtin_cpu_supports does not know are checked on
   every product and attention call, and CPUID traps to the hypervisor in a virtual machine (microseconds
   an instruction). */
static const unsigned *cpuid7(unsigned sub) {
    static unsigned regs[2][4];
    static int asked[2];
    if (!__atomic_load_n(&asked[sub], __ATOMIC_ACQUIRE)) {
        unsigned r[4] = {0, 0, 0, 0};
        (void)__get_cpuid_count(7, sub, &r[0], &r[1], &r[2], &r[3]);  /* (untouched without leaf 7) */
        memcpy(regs[sub], r, sizeof r);
        __atomic_store_n(&asked[sub], 1, __ATOMIC_RELEASE);
    }
    return regs[sub];
}
#else
#define HAVE_X86 0
#endif

/* ------------------------------------------------------------------------------------ entry points */

static int detected_path(void) {
#if HAVE_X86
    return cpu_has_avx512() ? PATH_AVX512 : cpu_has_avx2() ? PATH_AVX2 : PATH_PORTABLE;
#else
    return PATH_PORTABLE;
#endif
}

static int path = -1;

/* Which code path runs here: PATH_AVX512 (2), PATH_AVX2 (1) or PATH_PORTABLE (0). */
static int simd_path(void) {
    if (path < 0) path = detected_path();
    return path;
}

/* Every later call takes at most path `limit` (the tests run each path so on an AVX-512 machine; the
   portable one is what ARM and older CPUs run); a limit above what the CPU has gives the detected path.
   Returns simd_path() after the change. */
static int limit_path(int limit) {
    int found = detected_path();
    path = limit < found ? (limit < 0 ? 0 : limit) : found;
    return simd_path();
}

/* The largest number of threads a call may use (1 without OpenMP). */
static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* How a SIMD path splits m rows into register tiles: the sizes, in order; returns how many. The rows of
   each tile are packed input-major (see pack_rows), so that a tile reads x[i * mr + r]: one pointer for
   all its rows, where a pointer per row ran out of registers at 16 rows. */
static int64_t tile_plan(int simd, int64_t m, int64_t *sizes) {
    int64_t most = simd == PATH_AVX512 ? (m <= MR_MAX ? MR_MAX : MR_HALF) : (m <= 2 ? 2 : 6);
    /* ceil(m / most) tiles, so none is larger than its table (25 rows: 13 and 12, a whole-panel tile). */
    int64_t tiles = (m + most - 1) / most;
    for (int64_t t = 0; t < tiles; t++) sizes[t] = m / tiles + (t < m % tiles);
    return tiles;
}

/* x [m, k] → xp, tile by tile (as tile_plan splits m): tile t's rows r0 .. r0 + mr - 1 at xp + r0 * k,
   input-major (element (i, r) at i * mr + r). */
static void pack_rows(const float *x, int64_t m, int64_t k, const int64_t *sizes, int64_t tiles, float *xp) {
    (void)m;
    for (int64_t t = 0, r0 = 0; t < tiles; r0 += sizes[t], t++)
        for (int64_t r = 0; r < sizes[t]; r++)
            for (int64_t i = 0; i < k; i++) xp[r0 * k + i * sizes[t] + r] = x[(r0 + r) * k + i];
}

/* The end of an int8 product (see finish_i8_x86), on path `simd`; of a q4 one (`scaled` 0: its scales
   are inside the sums), bias and act only. */
static void finish_i8(int simd, const uint16_t *w, int64_t k, float *y, int64_t rows, int64_t n, int64_t j0,
                      int64_t j1, const float *b, int act, int scaled) {
#if HAVE_X86
    if (simd) { finish_i8_x86(w, k, y, rows, n, j0, j1, b, act, scaled); return; }
#endif
    (void)simd;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = j0; j < j1; j++) {
            float s = scaled ? scales_of(w, j / PANEL, k)[j % PANEL] : 1.0f;
            float v = y[r * n + j] * s + (b ? b[j] : 0.0f);
            y[r * n + j] = act ? gelu_new(v) : v;
        }
}

/* Panels p0 .. p1 - 1 of y [m, n] for rows x [m, k] (m <= MC), on path `simd`. */
static void panels(int simd, const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t p0, int64_t p1,
                   const float *b, float *y, int64_t n, int fmt, int act, const int64_t *sizes, int64_t tiles) {
#if HAVE_X86
    if (simd == PATH_AVX512) { panels_avx512(x, m, k, w, p0, p1, b, y, n, fmt, act, sizes, tiles); return; }
    if (simd == PATH_AVX2) { panels_avx2(x, m, k, w, p0, p1, b, y, n, fmt, act, sizes, tiles); return; }
#endif
    (void)sizes; (void)tiles;
    (void)simd;
    panels_portable(x, m, k, w, p0, p1, b, y, n, fmt, act);
}

/* ------------------------------------------------------------------------------------ int8 products
   An int8 weight is multiplied by int8 inputs, as llama.cpp's q8_0 does: each row of x is quantized at
   the start of a product in blocks of QB = 32 inputs, x[i] ~ q[i] * d (d = max |block| / 127, q rounded
   to nearest even), so that a block's products are an exact int32 sum of int8 products, which VNNI's
   vpdpbusd computes 64 at a time (four times float32's FMAs per instruction). Then

       y[m, j] = scale[j] * sum over blocks of d[m, block] * isum[m, j, block]   (+ bias, then gelu)

   The int32 sums are exact on every path and the float sum runs over the blocks in order, one FMA each
   (plain multiply-add on the portable path), so a row gets the same bits in any batch, and the AVX2 path
   the AVX-512 path's. A block holding inf or NaN gets d = NaN: the outputs are NaN, never garbage.
   With FMT_ROWS (the backend's inputs=rows) a block is the whole row (bs = kpad(k)): one d a row, one
   int32 sum over all of k (at most 255 * 127 * k in vpdpbusd's offset form: exact up to k ~ 66000), and
   y = scale[j] * (d[m] * float(isum)), the same bits on every path. */

/* Row x [k] → q [kpad(k)] (the padding zero), d [kpad / bs] and c [kpad / bs] = -128 * sum of each
   block's q (the correction of vpdpbusd's unsigned operand, see q8tile512), in blocks of bs inputs: QB,
   or the whole row (kpad(k)) for FMT_ROWS. */
static void quantize_row(const float *x, int64_t k, int8_t *q, float *d, int32_t *c, int64_t bs) {
    for (int64_t b0 = 0, blk = 0; b0 < kpad(k); b0 += bs, blk++) {
        int64_t end = min64(k, b0 + bs);
        float amax = 0.0f;
        int finite = 1;
        for (int64_t i = b0; i < end; i++) {
            float a = fabsf(x[i]);
            finite &= a <= 3.4028235e38f;  /* false for inf and NaN */
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
        int32_t sum = 0;
        for (int64_t i = b0; i < b0 + bs; i++) {
            float v = i < end && finite ? x[i] * id : 0.0f;
            /* Round to nearest, ties to even, as rintf in the default mode: 1.5 * 2^23 pushes the fraction
               out of a float32 (|v| <= 127.5). */
            v = (v + 12582912.0f) - 12582912.0f;
            int32_t qi = (int32_t)v;
            qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
            q[i] = (int8_t)qi;
            sum += qi;
        }
        d[blk] = finite ? dd : NAN;
        c[blk] = -128 * sum;
    }
}

/* Portable C: rows r0 .. r0 + rows - 1 of the quantized x (q [rows][kp], d [rows][kb]) times panels
   p0 .. p1 - 1, the raw sums (before the scales) into y. */
static void q8_portable(const int8_t *q, const float *d, int64_t rows, int64_t k, int64_t bs, const int8_t *w,
                        int64_t p0, int64_t p1, float *y, int64_t n) {
    int64_t kp = kpad(k), kb = kp / bs, gs = panel_elems(k, FMT_I8);
    for (int64_t p = p0; p < p1; p++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < PANEL && p * PANEL + j < n; j++) {
                const int8_t *wp = w + p * gs + j * 4;
                const int8_t *qr = q + r * kp;
                float acc = 0.0f;
                for (int64_t blk = 0; blk < kb; blk++) {
                    int32_t s = 0;
                    for (int64_t i = blk * bs; i < (blk + 1) * bs; i++) s += (int32_t)qr[i] * wp[(i >> 2) * 4 * PANEL + (i & 3)];
                    acc += d[r * kb + blk] * (float)s;
                }
                y[r * n + p * PANEL + j] = acc;
            }
}

#if HAVE_X86
#define X512V __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* quantize_row in AVX-512, lane for lane the same operations (max |x|, x * id, the round by 1.5 * 2^23,
   the clamp, the sum), so the same q, d and c: at a prompt's many rows the scalar loop cost a sixth of
   a product. A block holding inf or NaN (a lane failing |x| <= FLT_MAX) is left to quantize_row. */
X512 static void quantize_row512(const float *x, int64_t k, int8_t *q, float *d, int32_t *c, int64_t bs) {
    const __m512 magic = _mm512_set1_ps(12582912.0f), big = _mm512_set1_ps(3.4028235e38f);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t b0 = 0, blk = 0; b0 < kpad(k); b0 += bs, blk++) {
        int64_t end = min64(k, b0 + bs);
        __m512 vmax = _mm512_setzero_ps();
        __mmask16 finite = 0xFFFF;
        for (int64_t i = b0; i < end; i += 16) {
            __mmask16 m = end - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (end - i)) - 1);
            __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + i));
            finite &= _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ);
            vmax = _mm512_max_ps(vmax, a);
        }
        if (finite != 0xFFFF) {
            quantize_row(x + b0, end - b0, q + b0, d + blk, c + blk, bs);  /* one block: NaN d, zero q */
            continue;
        }
        float amax = _mm512_reduce_max_ps(vmax);
        float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i sum = _mm512_setzero_si512();
        for (int64_t i = b0; i < b0 + bs; i += 16) {
            __mmask16 m = end - i >= 16 ? (__mmask16)0xFFFF : end <= i ? 0 : (__mmask16)((1u << (end - i)) - 1);
            __m512 v = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vid), magic), magic);
            __m512i qi = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
            _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(qi));
            sum = _mm512_add_epi32(sum, qi);
        }
        d[blk] = dd;
        c[blk] = -128 * _mm512_reduce_add_epi32(sum);
    }
}

/* x [i .. i + 8), lanes from `end` on zero (masked: no read past the row). */
X86 static INLINE __m256 load8_upto(const float *x, int64_t i, int64_t end) {
    if (end - i >= 8) return _mm256_loadu_ps(x + i);
    return _mm256_maskload_ps(x + i, keep8(end - i));
}

/* quantize_row512 in AVX2, 8 lanes at a time: the same operations, so the same q, d and c. */
X86 static void quantize_row256(const float *x, int64_t k, int8_t *q, float *d, int32_t *c, int64_t bs) {
    const __m256 magic = _mm256_set1_ps(12582912.0f), big = _mm256_set1_ps(3.4028235e38f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b0 = 0, blk = 0; b0 < kpad(k); b0 += bs, blk++) {
        int64_t end = min64(k, b0 + bs);
        __m256 vmax = _mm256_setzero_ps();
        int finite = 1;
        for (int64_t i = b0; i < end; i += 8) {
            __m256 a = _mm256_and_ps(load8_upto(x, i, end), magnitude);
            finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_LE_OQ)) == 0xFF;
            vmax = _mm256_max_ps(vmax, a);
        }
        if (!finite) {
            quantize_row(x + b0, end - b0, q + b0, d + blk, c + blk, bs);  /* one block: NaN d, zero q */
            continue;
        }
        float amax = hmax(vmax);
        float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i sum = _mm256_setzero_si256();
        for (int64_t i = b0; i < b0 + bs; i += 8) {
            __m256 v = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(load8_upto(x, i, end), vid), magic), magic);
            __m256i qi = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
            __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
            _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(q16, q16));
            sum = _mm256_add_epi32(sum, qi);
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        d[blk] = dd;
        c[blk] = -128 * _mm_cvtsi128_si32(s4);
    }
}

/* The raw sums of a tile: `mr` rows times `nv` vectors of 16 outputs, vector v the half (h0 + v) % 2 of
   panel (h0 + v) / 2 from w (gs bytes a panel). xg: the rows' 4-input groups as int32, input-major
   ([group][mr]); dd, cc: their blocks' d and c ([block][mr]). vpdpbusd multiplies unsigned bytes by
   signed ones: the weights, two's complement, become unsigned by flipping their top bit (w + 128), and
   each block's int32 sum starts at -128 * sum(q) to take the 128s back out. */
X512V static INLINE void q8tile512(const int32_t *xg, const float *dd, const int32_t *cc, int64_t kb,
                                   int64_t sub, const int8_t *w, int64_t gs, const int mr, const int nv, const int h0,
                                   float *y, int64_t n, int64_t col0) {
    __m512 fa[12][8];
    __m512i ia[12][8], wv[8];
    const __m512i top = _mm512_set1_epi8((char)0x80);
    const int8_t *base[8];
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) base[v] = w + ((h0 + v) / 2) * gs + ((h0 + v) % 2) * 64;
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) fa[r][v] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < kb; blk++) {
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            __m512i c = _mm512_set1_epi32(cc[blk * mr + r]);
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) ia[r][v] = c;
        }
        for (int64_t sb = 0; sb < sub; sb++)
#pragma GCC unroll 8
        for (int g = 0; g < QB / 4; g++) {
            int64_t gi = (blk * sub + sb) * (QB / 4) + g;
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) {
                if (mr < 4) _mm_prefetch((const char *)base[v] + gi * 128 + 2 * PREFETCH, _MM_HINT_T0);
                wv[v] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(base[v] + gi * 128)), top);
            }
#pragma GCC unroll 12
            for (int r = 0; r < mr; r++) {
                __m512i xb = _mm512_set1_epi32(xg[gi * mr + r]);
#pragma GCC unroll 8
                for (int v = 0; v < nv; v++) ia[r][v] = _mm512_dpbusd_epi32(ia[r][v], wv[v], xb);
            }
        }
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            __m512 db = _mm512_set1_ps(dd[blk * mr + r]);
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) fa[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r][v]), db, fa[r][v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) {
            int64_t col = col0 + ((h0 + v) / 2) * PANEL + ((h0 + v) % 2) * 16;
            if (col >= n) continue;
            __mmask16 keep = n - col >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - col)) - 1);
            _mm512_mask_storeu_ps(y + r * n + col, keep, fa[r][v]);
        }
}

#define ARGSQ8 const int32_t *xg, const float *dd, const int32_t *cc, int64_t kb, int64_t sub, const int8_t *w, int64_t gs, \
               int h0, float *y, int64_t n, int64_t col0
typedef void (*q8_fn)(ARGSQ8);
#define Q512(MR, NV) \
    X512V static void q512_##MR##_##NV(ARGSQ8) { \
        if (h0) q8tile512(xg, dd, cc, kb, sub, w, gs, MR, NV, 1, y, n, col0); \
        else q8tile512(xg, dd, cc, kb, sub, w, gs, MR, NV, 0, y, n, col0); }
Q512(1, 2) Q512(1, 4) Q512(1, 6) Q512(1, 8) Q512(2, 2) Q512(2, 4) Q512(3, 2) Q512(3, 4) Q512(4, 2) Q512(5, 2)
Q512(6, 2) Q512(1, 1) Q512(2, 1) Q512(3, 1) Q512(4, 1) Q512(5, 1) Q512(6, 1) Q512(7, 1) Q512(8, 1) Q512(9, 1)
Q512(10, 1) Q512(11, 1) Q512(12, 1)
/* [rows][panels] for up to 3 rows (4 panels at one row, 2 at two or three); [rows] over a whole panel
   for 4 to 6; [rows] over half a panel up to 12. */
static const q8_fn WIDEQ8[4][5] = {{NULL}, {NULL, q512_1_2, q512_1_4, q512_1_6, q512_1_8},
                                   {NULL, q512_2_2, q512_2_4}, {NULL, q512_3_2, q512_3_4}};
static const q8_fn WHOLEQ8[7] = {NULL, q512_1_2, q512_2_2, q512_3_2, q512_4_2, q512_5_2, q512_6_2};
static const q8_fn HALFQ8[13] = {NULL, q512_1_1, q512_2_1, q512_3_1, q512_4_1, q512_5_1, q512_6_1, q512_7_1,
                                 q512_8_1, q512_9_1, q512_10_1, q512_11_1, q512_12_1};

/* AVX2 (no VNNI): the same int32 sums as llama.cpp's AVX2 q8_0 dot: |q| times the weight with q's sign
   (vpsignb), pairs summed by vpmaddubsw (at most 2 * 127 * 127: no saturation), then vpmaddwd by ones.
   `mr` rows times `nv` vectors of 8 outputs, vector v the quarter (h0 + v) % 4 of panel (h0 + v) / 4. */
X86 static INLINE void q8tile256(const int32_t *xg, const float *dd, int64_t kb, int64_t sub, const int8_t *w, int64_t gs,
                                 const int mr, const int nv, const int h0, float *y, int64_t n, int64_t col0) {
    __m256 fa[2][4];
    __m256i ia[2][4], wv[4];
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *base[4];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) base[v] = w + ((h0 + v) / 4) * gs + ((h0 + v) % 4) * 32;
#pragma GCC unroll 2
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) fa[r][v] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < kb; blk++) {
#pragma GCC unroll 2
        for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) ia[r][v] = _mm256_setzero_si256();
        /* (a group at a time: unrolled, GCC regrouped the exact integer sums of all 8 groups and spilled
           the partial sums to the stack) */
        for (int64_t sb = 0; sb < sub; sb++)
#pragma GCC unroll 1
        for (int g = 0; g < QB / 4; g++) {
            int64_t gi = (blk * sub + sb) * (QB / 4) + g;
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) wv[v] = _mm256_loadu_si256((const __m256i *)(base[v] + gi * 128));
#pragma GCC unroll 2
            for (int r = 0; r < mr; r++) {
                __m256i xb = _mm256_set1_epi32(xg[gi * mr + r]), ax = _mm256_abs_epi8(xb);
#pragma GCC unroll 4
                for (int v = 0; v < nv; v++)
                    ia[r][v] = _mm256_add_epi32(ia[r][v], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[v], xb)), ones));
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < mr; r++) {
            __m256 db = _mm256_set1_ps(dd[blk * mr + r]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) fa[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r][v]), db, fa[r][v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) {
            int64_t col = col0 + ((h0 + v) / 4) * PANEL + ((h0 + v) % 4) * 8;
            if (col >= n) continue;
            float t[8];
            _mm256_storeu_ps(t, fa[r][v]);
            for (int64_t j = 0; j < 8 && col + j < n; j++) y[r * n + col + j] = t[j];
        }
}

#define Q256(MR, NV) \
    X86 static void q256_##MR##_##NV(ARGSQ8) { (void)cc; \
        if (h0) q8tile256(xg, dd, kb, sub, w, gs, MR, NV, 2, y, n, col0); \
        else q8tile256(xg, dd, kb, sub, w, gs, MR, NV, 0, y, n, col0); }
Q256(1, 4) Q256(1, 2) Q256(2, 2)

static int cpu_has_vnni(void) {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
}
#endif

/* --------------------------------------------------------------------------------- AMX int8 products
   Intel's AMX (Sapphire Rapids and later) multiplies int8 tiles: one TDPBSSD adds a 16 x K by K x 16
   int8 product into a 16 x 16 int32 tile. Used for products of many rows (amx_rows), it keeps the VNNI
   path's arithmetic exactly, so a row gets the same bits on either path:

   - one TDPBSSD per block of QB = 32 inputs (K = 32, half a tile's depth): each block's int32 sums must
     stay apart, since each is scaled by its own d. The sums are exact, as vpdpbusd's (signed by signed:
     no -128 correction needed);
   - the 16 x 16 sums stored, then for each row converted and added in AVX-512 as q8tile512 does,
     fa = fmadd(float(sum), d, fa), over the blocks in order, from zero.

   The weights need no repacking: a B tile (8 rows of 16 outputs x 4 inputs) is half of a block's 8 groups
   in a panel, its rows 128 bytes apart; an A tile is 16 quantized rows (kp bytes apart), 32 bytes each.
   Tile data needs the OS's consent (XCR0, and on Linux arch_prctl); without it the VNNI path runs. */

/* AMX's intrinsics: x86-64 only, GCC 11 and clang 12 on (an older compiler builds the rest without it). */
#if HAVE_X86 && defined(INFERNO_HALF_EMULATE_AMX)
#define HAVE_AMX 1 /* the tiles in plain C: the tests' build (_amx_emulated.h) */
#elif HAVE_X86 && defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

#if HAVE_AMX
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef INFERNO_HALF_EMULATE_AMX
#include "_amx_emulated.h"
#define XAMX X512
#else
#define XAMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

/* Tiles 0, 1: A (16 rows x QB bytes); 2, 3: B (QB / 4 rows x 64 bytes); 4, 5: the sums (16 x 16 int32).
   Two of each, for alternate blocks: the next block's tile work runs while this one's FMAs do. Static
   and const: ldtilecfg's asm tells the compiler of only 8 of its 64 bytes, so stores to a local could be
   dropped. */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) AMX_CONFIG = {1, 0, {0}, {QB, QB, 64, 64, 64, 64}, {16, 16, QB / 4, QB / 4, 16, 16}};

/* Why AMX cannot run here ("" when it can): the CPU, the OS's tile state (XCR0 bits 17, 18), or the Linux
   kernel's permission for tile data, asked once per process (arch_prctl ARCH_REQ_XCOMP_PERM, 0x1023,
   for XFEATURE_XTILEDATA, 18), before the first tile is used. */
static const char *amx_check(void) {
#ifdef INFERNO_HALF_EMULATE_AMX
    return cpu_has_vnni() ? "" : "CPU lacks AVX-512 VNNI (the emulated tiles' surroundings need it)";
#else
    unsigned a, b, c, d;
    if (!cpu_has_vnni() || !(cpuid7(0)[3] & (1u << 24)) || !(cpuid7(0)[3] & (1u << 25)))
        return "CPU lacks AMX-INT8";
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return "the OS does not enable AMX tile state";
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) return "the OS does not enable AMX tile state";
#ifdef __linux__
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return "the kernel refused AMX tile data";
    return "";
#else
    return "AMX tile data is requested on Linux only";
#endif
#endif
}

/* tilestored of tile T to s (16 rows of 64 bytes), telling the compiler which memory it writes: the
   intrinsic's "memory" clobber would keep the accumulators below in memory, not registers. */
#ifdef INFERNO_HALF_EMULATE_AMX
#define AMX_STORE(T, s) emu_tile_stored(T, s, 64)
#else
#define AMX_STORE(T, s) \
    __asm__ volatile("{tilestored\t%%tmm" #T ", (%1,%2,1)|tilestored\t[%1+%2*1], %%tmm" #T "}" \
                     : "=m"(*(int32_t(*)[256])(s)) : "r"(s), "r"((long)64))
#endif

/* The sums of one block (tiles A, B into C, stored at s) for 16 rows by 16 outputs. */
#define AMX_BLOCK(A, B, C, q, kp, w, blk, s) do { \
    _tile_loadd(A, (q) + (blk) * QB, kp); \
    _tile_loadd(B, (w) + (blk) * (QB / 4) * 4 * PANEL, 4 * PANEL); \
    _tile_zero(C); \
    _tile_dpbssd(C, A, B); \
    AMX_STORE(C, s); } while (0)

/* acc[r] += float(s[r]) * d of row r for block blk (d: the block's 16), q8tile512's FMA lane for lane; for
   q4 (sc: the float16 scales of these 16 outputs in block 0, Q4_BLOCK bytes a block; NULL for int8)
   scaled by s * d, q4tile512's. A macro: acc passed by pointer to a function stayed in memory. */
#define AMX_FMA(acc, s, d, sc, blk) do { \
    __m512 sv = (sc) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((sc) + (blk) * Q4_BLOCK))) \
                     : _mm512_setzero_ps(); \
    _Pragma("GCC unroll 16") \
    for (int r = 0; r < 16; r++) { \
        __m512 dr = _mm512_set1_ps((d)[r]); \
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)((s) + 16 * r))), \
                                 (sc) ? _mm512_mul_ps(sv, dr) : dr, acc[r]); \
    } } while (0)

/* The raw sums of 16 rows of q (kp bytes a row; rows past `rows` zero) by the 16 outputs of w (half an
   int8 panel), over every block, the first `rows` rows into y at col. d: the rows' d block-major
   ([kb][16]); sc: q4's scales (see AMX_FMA), NULL for int8. Inlined into each caller, sc NULL or not. */
XAMX static INLINE void amx16(const int8_t *q, int64_t kp, const float *d, int64_t kb, const int8_t *w,
                              const uint8_t *sc, int rows, float *y, int64_t n, int64_t col) {
    __m512 acc[16];
    int32_t s[2][256] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    AMX_BLOCK(0, 2, 4, q, kp, w, 0, s[0]);
    for (int64_t blk = 0; blk < kb; blk += 2) {
        if (blk + 1 < kb) AMX_BLOCK(1, 3, 5, q, kp, w, blk + 1, s[1]);
        AMX_FMA(acc, s[0], d + blk * 16, sc, blk);
        if (blk + 1 < kb) {
            if (blk + 2 < kb) AMX_BLOCK(0, 2, 4, q, kp, w, blk + 2, s[0]);
            AMX_FMA(acc, s[1], d + (blk + 1) * 16, sc, blk + 1);
        }
    }
    __mmask16 keep = n - col >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - col)) - 1);
    /* (All 16 indices constant, so that acc stays in registers.) */
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        if (r < rows) _mm512_mask_storeu_ps(y + r * n + col, keep, acc[r]);
}

/* Panels p0 .. p1 - 1 of the raw sums for the quantized rows q [m][kp] (rows padded with zeros to a
   multiple of 16; d: each tile of 16 rows' d block-major, [kb][16], at r0 * kb), on AMX. The B tiles come
   from int8 panels, panel p at wi + (p - p0) * gs; w4: the q4 weight they were unpacked from (its scales),
   NULL for int8. Tiles of rows outermost: their q stays in L1 while the task's panels go by. The tile
   configuration is loaded by the thread that runs it and released at the end (tiles left in use make
   each context switch save 8 KB). */
XAMX static void amx_panels(const int8_t *q, const float *d, int64_t m, int64_t k, const int8_t *wi, int64_t gs,
                            const uint16_t *w4, int64_t p0, int64_t p1, float *y, int64_t n) {
    int64_t kp = kpad(k), kb = kp / QB;
    _tile_loadconfig(&AMX_CONFIG);
    for (int64_t r0 = 0; r0 < m; r0 += 16)
        for (int64_t p = p0; p < p1; p++)
            for (int h = 0; h < 2; h++) {
                int64_t col = p * PANEL + h * 16;
                if (col >= n) break;
                const int8_t *b = wi + (p - p0) * gs + h * 64;
                int rows = (int)min64(16, m - r0);
                if (w4) {
                    const uint8_t *sc = (const uint8_t *)w4 + p * panel_elems(k, FMT_Q4) + QB * PANEL / 2
                                        + h * 32;
                    amx16(q + r0 * kp, kp, d + r0 * kb, kb, b, sc, rows, y + r0 * n, n, col);
                } else {
                    amx16(q + r0 * kp, kp, d + r0 * kb, kb, b, NULL, rows, y + r0 * n, n, col);
                }
            }
    _tile_release();
}

/* amx_panels for an int8 weight w. */
XAMX static void q8_panels_amx(const int8_t *q, const float *d, int64_t m, int64_t k, const int8_t *w, int64_t p0,
                               int64_t p1, float *y, int64_t n) {
    int64_t gs = panel_elems(k, FMT_I8);
    amx_panels(q, d, m, k, w + p0 * gs, gs, NULL, p0, p1, y, n);
}

/* FMT_ROWS on AMX: with one input scale per row, a row's int32 sum runs over all of k, so the tiles
   accumulate at full depth (K = 64, TDPBSSD's) and are stored once, at the end: no per-block work in
   AVX-512 (the block path above is bound by it). 32 rows by a panel's 32 outputs a step (A tiles 0, 1,
   B tiles 2, 3, sums 4 to 7); the sums are exact, as vpdpbusd's, so y = float(sum) * d is the VNNI
   path's bits (its fmadd(float(sum), d, 0)). kp a multiple of 64 (else the VNNI path runs). */
/* All eight tiles 16 rows of 64 bytes (the bfloat16 attention's tiles too). */
struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
static const struct amx_config __attribute__((aligned(64))) AMX_FULL_CONFIG = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

X512 static inline __m512 exp16(__m512 x);

/* exp_sum8 16 at a time. */
X512 static inline float exp_sum16(float *s, int64_t n, float m) {
    int64_t j = 0;
    __m512 vm = _mm512_set1_ps(m), vs = _mm512_setzero_ps();
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
        _mm512_storeu_ps(s + j, e);
        vs = _mm512_add_ps(vs, e);
    }
    float sum = _mm512_reduce_add_ps(vs);
    for (; j < n; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
    return sum;
}

/* gelu8's operations 16 lanes at a time (the same bits lane for lane). */
X512 static inline __m512 gelu16(__m512 x) {
    __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    __m512 u = _mm512_mul_ps(_mm512_set1_ps(-2.0f * 0.7978845608028654f),
                             _mm512_fmadd_ps(x3, _mm512_set1_ps(0.044715f), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(u)));
}

/* Sums tile T (16 rows x 16 outputs at col) stored to s, then each row's float(sum) * d[r], and the end
   of the product as finish_i8_x86 does it lane for lane: one FMA with the output's scale and bias (0
   without), then gelu_new with act; rows below `rows`, outputs below n. */
#define AMX_ROWS_OUT(T, s, d, rows, y, n, col, sc, b, act) do { \
    AMX_STORE(T, s); \
    if ((col) < (n)) { \
        __mmask16 keep = (n) - (col) >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ((n) - (col))) - 1); \
        __m512 scale = _mm512_loadu_ps(sc), bias = (b) ? _mm512_maskz_loadu_ps(keep, (b) + (col)) : _mm512_setzero_ps(); \
        for (int r = 0; r < (rows); r++) { \
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)((s) + 16 * r))), \
                                     _mm512_set1_ps((d)[r])); \
            v = _mm512_fmadd_ps(v, scale, bias); \
            if (act) v = gelu16(v); \
            _mm512_mask_storeu_ps((y) + r * (n) + (col), keep, v); \
        } \
    } } while (0)

/* Panels p0 .. p1 - 1 of the product of the quantized rows q [m][kp] (padded with zero rows to a
   multiple of 16; d [m] their scales), finished (scales, bias b, gelu_new with act), into y. */
XAMX static void q8_panels_amx_rows(const int8_t *q, const float *d, int64_t m, int64_t k, const int8_t *w,
                                    int64_t p0, int64_t p1, float *y, int64_t n, const float *b, int act) {
    int64_t kp = kpad(k), gs = panel_elems(k, FMT_I8);
    int32_t s[256] __attribute__((aligned(64)));
    _tile_loadconfig(&AMX_FULL_CONFIG);
    for (int64_t r0 = 0; r0 < m; r0 += 32) {
        int two = r0 + 16 < m;  /* a second tile of rows */
        const int8_t *qa = q + r0 * kp, *qb = qa + 16 * kp;
        for (int64_t p = p0; p < p1; p++) {
            const int8_t *wp = w + p * gs;
            const float *sc = scales_of((const uint16_t *)w, p, k);
            _tile_zero(4); _tile_zero(5);
            if (two) {
                _tile_zero(6); _tile_zero(7);
                for (int64_t i = 0; i < kp; i += 64) {
                    /* 16 groups of 4 inputs: rows 128 bytes apart, each half panel 64 bytes of them */
                    _tile_loadd(2, wp + i * PANEL, 4 * PANEL);
                    _tile_loadd(3, wp + i * PANEL + 64, 4 * PANEL);
                    _tile_loadd(0, qa + i, kp);
                    _tile_loadd(1, qb + i, kp);
                    _tile_dpbssd(4, 0, 2);
                    _tile_dpbssd(5, 0, 3);
                    _tile_dpbssd(6, 1, 2);
                    _tile_dpbssd(7, 1, 3);
                }
            } else {
                for (int64_t i = 0; i < kp; i += 64) {
                    _tile_loadd(2, wp + i * PANEL, 4 * PANEL);
                    _tile_loadd(3, wp + i * PANEL + 64, 4 * PANEL);
                    _tile_loadd(0, qa + i, kp);
                    _tile_dpbssd(4, 0, 2);
                    _tile_dpbssd(5, 0, 3);
                }
            }
            int64_t col = p * PANEL;
            int ra = (int)min64(16, m - r0);
            AMX_ROWS_OUT(4, s, d + r0, ra, y + r0 * n, n, col, sc, b, act);
            AMX_ROWS_OUT(5, s, d + r0, ra, y + r0 * n, n, col + 16, sc + 16, b, act);
            if (two) {
                int rb = (int)min64(16, m - r0 - 16);
                AMX_ROWS_OUT(6, s, d + r0 + 16, rb, y + (r0 + 16) * n, n, col, sc, b, act);
                AMX_ROWS_OUT(7, s, d + r0 + 16, rb, y + (r0 + 16) * n, n, col + 16, sc + 16, b, act);
            }
        }
    }
    _tile_release();
}

/* Rows a task of product_rows_amx takes (a multiple of 32: its tiles of rows go in pairs). */
#define AMX_ROW_BLOCK 96

/* product() of an int8 weight with inputs=rows on AMX: every row quantized (in parallel), then tasks of
   AMX_ROW_BLOCK rows by TASK panels split among the threads, each finishing its outputs. Returns 0, or
   -1 out of memory. */
XAMX static int product_rows_amx(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                                 const float *b, float *y, int threads, int act) {
    int64_t kp = kpad(k), mp = (m + 15) / 16 * 16, count = (n + PANEL - 1) / PANEL;
    int64_t ptasks = (count + TASK - 1) / TASK, rtasks = (m + AMX_ROW_BLOCK - 1) / AMX_ROW_BLOCK;
    int8_t *q = malloc((size_t)(mp * kp));
    float *d = malloc(sizeof(float) * (size_t)mp);
    if (!q || !d) { free(q); free(d); return -1; }
    memset(q + m * kp, 0, (size_t)((mp - m) * kp));
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1)
#endif
    {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t r = 0; r < m; r++) {
            int32_t c;
            quantize_row512(x + r * k, k, q + r * kp, d + r, &c, kp);
        }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t t = 0; t < rtasks * ptasks; t++) {
            int64_t r0 = t / ptasks * AMX_ROW_BLOCK, p0 = t % ptasks * TASK;
            q8_panels_amx_rows(q + r0 * kp, d + r0, min64(AMX_ROW_BLOCK, m - r0), k, (const int8_t *)w, p0,
                               min64(count, p0 + TASK), y + r0 * n, n, b, act);
        }
    }
    free(q); free(d);
    return 0;
}
#endif

/* Products of at least this many rows run on AMX where it can (see amx_rows); 0: never. */
#ifndef AMX_ROWS
#define AMX_ROWS 16
#endif
static int amx_min_rows = AMX_ROWS;

/* Why AMX cannot run on this machine, "" when it can (checked once). */
static const char *amx_support(void) {
#if HAVE_AMX
    static const char *why = NULL;
    const char *w = __atomic_load_n(&why, __ATOMIC_ACQUIRE);
    if (!w) {
        w = amx_check();
        __atomic_store_n(&why, w, __ATOMIC_RELEASE);
    }
    return w;
#else
    return HAVE_X86 ? "the compiler that built the kernels lacks AMX" : "CPU lacks AMX-INT8";
#endif
}

/* How the int8 path `simd` (PATH_AVX512 with VNNI, PATH_AVX2, else portable) splits m rows into tiles
   (sizes, in order; returns how many): AVX-512 up to 6 rows in one tile, more in balanced tiles of up to
   12 (over half panels); AVX2 tiles of 2 rows (the last 1 for odd m); portable one tile. */
static int64_t q8_plan(int simd, int64_t m, int64_t *sizes) {
    int64_t most = simd == PATH_AVX512 ? (m <= 6 ? 6 : 12) : simd == PATH_AVX2 ? 2 : m;
    int64_t tiles = (m + most - 1) / most;
    if (simd == PATH_AVX2) {
        for (int64_t t = 0; t < tiles; t++) sizes[t] = min64(2, m - 2 * t);
        return tiles;
    }
    for (int64_t t = 0; t < tiles; t++) sizes[t] = m / tiles + (t < m % tiles);
    return tiles;
}

/* Panels p0 .. p1 - 1 of the raw sums for the packed tiles of the quantized rows (xg, dd, cc: tile t's at
   offsets r0 * groups and r0 * kb), on an x86 path. */
#if HAVE_X86
static void q8_panels_x86(int simd, const int32_t *xg, const float *dd, const int32_t *cc, int64_t m, int64_t k,
                          int64_t bs, const int8_t *w, int64_t p0, int64_t p1, float *y, int64_t n,
                          const int64_t *sizes, int64_t tiles) {
    int64_t kb = kpad(k) / bs, sub = bs / QB, groups = kpad(k) / 4, gs = panel_elems(k, FMT_I8);
    if (simd == PATH_AVX512 && m <= 3) {
        int64_t most = m == 1 ? 4 : 2;
        for (int64_t p = p0; p < p1;) {
            int64_t g = min64(most, p1 - p);
            WIDEQ8[m][g](xg, dd, cc, kb, sub, w + p * gs, gs, 0, y, n, p * PANEL);
            p += g;
        }
        return;
    }
    for (int64_t p = p0; p < p1; p++)
        for (int64_t t = 0, r0 = 0; t < tiles; r0 += sizes[t], t++) {
            const int32_t *xt = xg + r0 * groups;
            const float *dt = dd + r0 * kb;
            const int32_t *ct = cc + r0 * kb;
            float *yt = y + r0 * n;
            if (simd == PATH_AVX512 && sizes[t] <= 6 && tiles == 1) {
                WHOLEQ8[sizes[t]](xt, dt, ct, kb, sub, w + p * gs, gs, 0, yt, n, p * PANEL);
            } else if (simd == PATH_AVX512) {
                HALFQ8[sizes[t]](xt, dt, ct, kb, sub, w + p * gs, gs, 0, yt, n, p * PANEL);
                HALFQ8[sizes[t]](xt, dt, ct, kb, sub, w + p * gs, gs, 1, yt, n, p * PANEL);
            } else if (m == 1) {
                q256_1_4(xt, dt, ct, kb, sub, w + p * gs, gs, 0, yt, n, p * PANEL);
            } else {
                const q8_fn f = sizes[t] == 2 ? q256_2_2 : q256_1_2;
                f(xt, dt, ct, kb, sub, w + p * gs, gs, 0, yt, n, p * PANEL);
                f(xt, dt, ct, kb, sub, w + p * gs, gs, 1, yt, n, p * PANEL);
            }
        }
}
#endif

/* The int8 path this CPU runs under simd_path() `simd`: VNNI needs AVX-512 VNNI, else AVX2's. */
static int q8_path(int simd) {
#if HAVE_X86
    if (simd == PATH_AVX512 && !cpu_has_vnni()) return PATH_AVX2;
    return simd;
#else
    (void)simd;
    return PATH_PORTABLE;
#endif
}

/* Whether a chunk of `rows` rows of an int8 product runs on AMX, under the int8 path `simd`. */
static int uses_amx(int simd, int64_t rows) {
    return simd == PATH_AVX512 && amx_min_rows > 0 && rows >= amx_min_rows && !amx_support()[0];
}

#include "_kernels_q4.h" /* 4-bit products */

/* Which of the threads of the enclosing parallel region this one is (part of parts; 0 of 1 outside one). */
static void my_part(int64_t *part, int64_t *parts) {
#ifdef _OPENMP
    *part = omp_get_thread_num();
    *parts = omp_get_num_threads();
#else
    *part = 0;
    *parts = 1;
#endif
}

/* The run of `count` items (a product's panels, a decode step's query heads) the calling thread of a
   parallel region takes: one contiguous run each, as many items as the others' (a run the hardware
   prefetcher follows). (Equal tasks of TASK panels, dealt in order, split SmolLM2's 18 panels of 576
   outputs 12 to 6, and its 6 of 192 outputs 4 to 2.) */
static void my_share(int64_t count, int64_t *first, int64_t *end) {
    int64_t part, parts;
    my_part(&part, &parts);
    *first = count * part / parts;
    *end = count * (part + 1) / parts;
}

/* The weights of one product of x by several (nw) int8 or q4 weights of one format: weight j has ns[j]
   outputs in panels ws[j], bias bs[j] (or NULL), result ys[j] [m, ns[j]] (the projections that read the
   same input: q, k and v; gate and up). */
typedef struct { int nw; const uint16_t *const *ws; const int64_t *ns; const float *const *bs; float *const *ys; } Many;
#define MAX_MANY 3

/* product() for int8 or q4 weights (fmt), one or several of one input (Many): MC rows at a time, each chunk
   quantized once (quantize_row), packed tile by tile for the SIMD paths (AMX reads q as it is, its rows
   padded with zeros to whole tiles of 16, and d by tile), the panels of every weight split among the
   threads in one parallel loop, then finish_i8. Returns 0, or -1 out of memory. */
static int product_quant_many(const float *x, int64_t m, int64_t k, Many mw, int threads, int act, int fmt) {
    int64_t total = 0, first[MAX_MANY + 1], sizes[MC];
    for (int j = 0; j < mw.nw; j++) {  /* first[j]: weight j's first panel among all the weights' */
        first[j] = total;
        total += (mw.ns[j] + PANEL - 1) / PANEL;
    }
    first[mw.nw] = total;
    int by_row = fmt & FMT_ROWS;
    fmt &= ~FMT_ROWS;
    /* bs: the inputs of a block (of one input scale); kb: blocks a row */
    int64_t kp = kpad(k), bs = by_row ? kp : QB, kb = kp / bs, groups = kp / 4, mc0 = min64(m, MC);
    int64_t mq = (mc0 + 15) / 16 * 16;
#if HAVE_AMX
    if (by_row && fmt == FMT_I8 && kp % 64 == 0 && uses_amx(q8_path(simd_path()), m)) {
        for (int j = 0; j < mw.nw; j++)
            if (product_rows_amx(x, m, k, mw.ws[j], mw.ns[j], mw.bs[j], mw.ys[j], threads, act)) return -1;
        return 0;
    }
#endif
    int simd = q8_path(simd_path());
    int8_t *q = malloc((size_t)(mq * kp));
    float *d = malloc(sizeof(float) * (size_t)(mc0 * kb)), *dp = malloc(sizeof(float) * (size_t)(mq * kb));
    int32_t *c = malloc(sizeof(int32_t) * (size_t)(mc0 * kb)), *cp = malloc(sizeof(int32_t) * (size_t)(mc0 * kb));
    int32_t *xg = malloc(sizeof(int32_t) * (size_t)(mc0 * groups));
    int failed = !q || !d || !dp || !c || !cp || !xg;
    (void)threads;
    /* q4 on AMX: each thread's unpacked panels (q4_panels_amx) */
    int8_t *q4buf = NULL;
#if HAVE_AMX
    int64_t q4size = TASK * kp * PANEL, workers = threads > 1 ? threads : 1;
    if (fmt == FMT_Q4 && uses_amx(simd, mc0) && !failed) {
        q4buf = malloc((size_t)(workers * q4size));
        failed = !q4buf;
    }
#endif
    for (int64_t m0 = 0; m0 < m && !failed; m0 += MC) {
        int64_t mc = min64(MC, m - m0), pad = (mc + 15) / 16 * 16;
        int64_t tiles = fmt == FMT_Q4 ? q4_plan(simd, mc, sizes) : q8_plan(simd, mc, sizes);
        int amx = (fmt == FMT_Q4 || (fmt == FMT_I8 && !by_row)) && uses_amx(simd, mc);
        for (int64_t r = 0; r < mc; r++) {
#if HAVE_X86
            if (simd == PATH_AVX512) {
                quantize_row512(x + (m0 + r) * k, k, q + r * kp, d + r * kb, c + r * kb, bs);
                continue;
            }
            if (simd == PATH_AVX2) {
                quantize_row256(x + (m0 + r) * k, k, q + r * kp, d + r * kb, c + r * kb, bs);
                continue;
            }
#endif
            quantize_row(x + (m0 + r) * k, k, q + r * kp, d + r * kb, c + r * kb, bs);
        }
        if (amx) {
            memset(q + mc * kp, 0, (size_t)((pad - mc) * kp));
            for (int64_t r = 0; r < pad; r++)
                for (int64_t blk = 0; blk < kb; blk++)
                    dp[(r & ~15) * kb + blk * 16 + (r & 15)] = r < mc ? d[r * kb + blk] : 0.0f;
        }
        for (int64_t t = 0, r0 = 0; t < tiles && !amx; r0 += sizes[t], t++)
            for (int64_t r = 0; r < sizes[t]; r++) {
                for (int64_t g = 0; g < groups; g++)
                    memcpy(xg + r0 * groups + g * sizes[t] + r, q + (r0 + r) * kp + 4 * g, 4);
                for (int64_t blk = 0; blk < kb; blk++) {
                    dp[r0 * kb + blk * sizes[t] + r] = d[(r0 + r) * kb + blk];
                    /* (q4's nibbles are q + 8, not q + 128: its correction is a 16th of int8's) */
                    cp[r0 * kb + blk * sizes[t] + r] = c[(r0 + r) * kb + blk] / (fmt == FMT_Q4 ? 16 : 1);
                }
            }
        /* Each thread its run of all the weights' panels (my_share), in pieces of at most TASK panels
           (q4buf's size) within one weight. */
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1 && total > TASK)
#endif
        {
#if HAVE_AMX && defined(_OPENMP)
        int64_t worker = omp_get_thread_num();
#elif HAVE_AMX
        int64_t worker = 0;
#endif
        int64_t g, g1;
        my_share(total, &g, &g1);
        while (g < g1) {
            int j = 0;
            while (g >= first[j + 1]) j++;
            const uint16_t *w = mw.ws[j];
            int64_t n = mw.ns[j], p0 = g - first[j], p1 = min64(p0 + TASK, min64(g1, first[j + 1]) - first[j]);
            float *ym = mw.ys[j] + m0 * n;
            const float *b = mw.bs[j];
            g += p1 - p0;
#if HAVE_AMX
            if (amx && fmt == FMT_Q4) q4_panels_amx(q, dp, mc, k, w, p0, p1, ym, n, q4buf + worker * q4size);
            else if (amx) q8_panels_amx(q, dp, mc, k, (const int8_t *)w, p0, p1, ym, n);
            else
#endif
#if HAVE_X86
            if (simd != PATH_PORTABLE && fmt == FMT_Q4) q4_panels_x86(simd, xg, dp, cp, mc, k, w, p0, p1, ym, n, sizes, tiles);
            else if (simd != PATH_PORTABLE) q8_panels_x86(simd, xg, dp, cp, mc, k, bs, (const int8_t *)w, p0, p1, ym, n, sizes, tiles);
            else
#endif
            if (fmt == FMT_Q4) q4_portable(q, d, mc, k, w, p0, p1, ym, n);
            else q8_portable(q, d, mc, k, bs, (const int8_t *)w, p0, p1, ym, n);
            finish_i8(simd, w, k, ym, mc, n, p0 * PANEL, min64(n, p1 * PANEL), b, act, fmt == FMT_I8);
        }
        }
    }
    free(q); free(d); free(dp); free(c); free(cp); free(xg); free(q4buf);
    return failed ? -1 : 0;
}

static int product_quant(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n, const float *b,
                         float *y, int threads, int act, int fmt) {
    return product_quant_many(x, m, k, (Many){1, &w, &n, &b, &y}, threads, act, fmt);
}

/* y = x @ w.T + b, see the top of the file: x is [m, k], w the panels of n outputs, y [m, n]; with `act`
   1, y = gelu_new(x @ w.T + b) (the MLP's first product). MC rows at a time, each chunk's panels split
   among `threads` threads, one contiguous run each (my_share). Returns 0. */
static int product_in16(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n, const float *b,
                        float *y, int threads, int act);
static int product_unpaired(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n, const float *b,
                            float *y, int threads, int act);

static int product(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n, const float *b, float *y,
                   int fmt, int threads, int act) {
    if (fmt == FMT_BF16P) {
        int rc = product_in16(x, m, k, w, n, b, y, threads, act);
        return rc == 1 ? product_unpaired(x, m, k, w, n, b, y, threads, act) : rc;
    }
    if ((fmt & ~FMT_ROWS) == FMT_I8 || fmt == FMT_Q4) return product_quant(x, m, k, w, n, b, y, threads, act, fmt);
    int64_t count = (n + PANEL - 1) / PANEL, tasks = (count + TASK - 1) / TASK, sizes[MC];
    int simd = simd_path();
    float *xp = NULL;
    if (simd != PATH_PORTABLE && m > 1) {
        xp = malloc(sizeof(float) * (size_t)(min64(m, MC) * k));
        if (!xp) return -1;
    }
    (void)threads;
    for (int64_t m0 = 0; m0 < m; m0 += MC) {
        int64_t mc = min64(MC, m - m0), tiles = tile_plan(simd, mc, sizes);
        const float *xs = x + m0 * k;
        if (xp) { pack_rows(xs, mc, k, sizes, tiles, xp); xs = xp; }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1 && tasks > 1)
#endif
        {
            int64_t p0, end;
            for (my_share(count, &p0, &end); p0 < end; p0 += TASK)
                panels(simd, xs, mc, k, w, p0, min64(end, p0 + TASK), b, y + m0 * n, n, fmt, act, sizes, tiles);
        }
    }
    free(xp);
    return 0;
}

/* The products of x [m, k] by the weights of `mw` (one format), as product() each (no activation): in one
   parallel loop over all their panels for int8 and q4 (x quantized once), else one after another. */
static int products(const float *x, int64_t m, int64_t k, Many mw, int fmt, int threads) {
    if (mw.nw > MAX_MANY) return -1;
    if ((fmt & ~FMT_ROWS) == FMT_I8 || fmt == FMT_Q4) return product_quant_many(x, m, k, mw, threads, 0, fmt);
    for (int j = 0; j < mw.nw; j++)
        if (product(x, m, k, mw.ws[j], mw.ns[j], mw.bs[j], mw.ys[j], fmt, threads, 0)) return -1;
    return 0;
}

/* The float32 rows j0 .. j1 - 1 of the panels as a plain [j1 - j0, k] array: the embedding's gather and
   the host copy of a weight. */
static void unpack_rows(const uint16_t *w, int64_t k, int64_t j0, int64_t j1, float *dst, int fmt) {
    for (int64_t j = j0; j < j1; j++) {
        float *row = dst + (j - j0) * k, s = fmt == FMT_I8 ? scales_of(w, j / PANEL, k)[j % PANEL] : 1.0f;
        if (fmt == FMT_Q4) {
            for (int64_t i = 0; i < k; i++) row[i] = q4_at(w, j / PANEL, i, j % PANEL, k);
            continue;
        }
        for (int64_t i = 0; i < k; i++) row[i] = widen_at(w, elem_at(j / PANEL, i, j % PANEL, k, fmt), fmt) * s;
    }
}

/* Panels p0 .. p1 - 1 as float32 [k, (p1 - p0) * PANEL] (row-major: x @ it is the product of those
   outputs), for BLAS. Split among `threads` threads by rows of k. */
static void unpack_t(const uint16_t *w, int64_t k, int64_t p0, int64_t p1, float *dst, int fmt, int threads) {
    int64_t cols = (p1 - p0) * PANEL;
    int simd = simd_path();
    (void)threads; (void)simd;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads > 1)
#endif
    for (int64_t i = 0; i < k; i++)
        for (int64_t p = p0; p < p1; p++) {
            float *out = dst + i * cols + (p - p0) * PANEL;
#if HAVE_X86
            if (simd && (fmt == FMT_F16 || fmt == FMT_BF16)) {
                widen32_x86(w + elem_at(p, i, 0, k, fmt), out, fmt);
                continue;
            }
#endif
            if (fmt == FMT_Q4) {
                for (int j = 0; j < PANEL; j++) out[j] = q4_at(w, p, i, j, k);
                continue;
            }
            for (int j = 0; j < PANEL; j++)
                out[j] = widen_at(w, elem_at(p, i, j, k, fmt), fmt) * (fmt == FMT_I8 ? scales_of(w, p, k)[j] : 1.0f);
        }
}

/* ----------------------------------------------------- the small kernels of a decode step, in C
   At one token per step a layer norm or an attention over the cache is a few microseconds of work
   behind tens of microseconds of NumPy calls; these run them in one call each. */


/* Layer norm over the last axis of x [rows, c] (biased variance, sums in double), into out. */
static int layernorm_rows(const float *x, int64_t rows, int64_t c, const float *gamma, const float *beta,
                           double eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        float *o = out + r * c;
        double sum = 0.0, sq = 0.0;
        for (int64_t i = 0; i < c; i++) sum += xr[i];
        double mean = sum / (double)c;
        for (int64_t i = 0; i < c; i++) { double dv = xr[i] - mean; sq += dv * dv; }
        float inv = (float)(1.0 / sqrt(sq / (double)c + eps)), m = (float)mean;
        for (int64_t i = 0; i < c; i++) o[i] = (xr[i] - m) * inv * gamma[i] + beta[i];
    }
    return 0;
}

#if HAVE_X86
/* 8 (16) values of a KV cache row from element i, widened to float32 (see kv_at). */
X86 static inline __m256 kv_load8(const void *p, int64_t i, int h16) {
    return h16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
               : _mm256_loadu_ps((const float *)p + i);
}

X512 static inline __m512 kv_load16(const void *p, int64_t i, int h16) {
    return h16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
               : _mm512_loadu_ps((const float *)p + i);
}

/* Row j (`bytes` long) of a cache run into the CPU's cache ahead of its use (none if p is NULL). A decode row
   reads its cache as short runs, a head's keys and values each, a slot's length apart, and the hardware
   prefetcher starts over on each: so the attention kernels fetch this head's values while its scores run,
   and the next head's keys and values a pass ahead (benches/kv_cache_reads.c, docs/benchmarks-half.md).
   Always inlined: GCC drops a call to a function that only prefetches (it has no effect it must keep). */
X86 __attribute__((always_inline)) static inline void prefetch_row(const void *p, int64_t j, int64_t bytes) {
    if (!p) return;
    const char *r = (const char *)p + j * bytes;
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(r + b, _MM_HINT_T0);
}

/* The attention kernels below that read a cache are written once, as an always-inlined body with h16
   a parameter, and called with h16 a constant: the compiler makes a float32 and a float16 copy. */
#define KV_BODY __attribute__((always_inline)) static inline

X86 KV_BODY float dot_x86(const float *a, const void *b, int64_t d, int h16) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), kv_load8(b, c, h16), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 8), kv_load8(b, c + 8, h16), a1);
    }
    if (c < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), kv_load8(b, c, h16), a0);
    return hsum(_mm256_add_ps(a0, a1));
}

/* One query over `keys` keys, d a multiple of 8, in three passes: the scores (8-wide dot products)
   into `s`, their exponentials (8 at a time), then the weighted sum of the values: several times
   faster than the portable loop below (one scalar chain per dot product, a libm expf per key). kh, vh:
   the head's cache rows, float32 or (h16) float16. */
X86 KV_BODY void attend_x86_kv(const float *qi, const void *kh, const void *vh, int64_t keys, int64_t d,
                               float scale, float *s, float *o, const void *next_k, const void *next_v, int h16) {
    const int64_t es = h16 ? 2 : 4;
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < keys; j++) {
        if (next_k) {  /* a decode row: this head's values, the next head's keys */
            prefetch_row(vh, j, d * es);
            prefetch_row(next_k, j, d * es);
        }
        s[j] = dot_x86(qi, (const char *)kh + j * d * es, d, h16) * scale;
        if (s[j] > m) m = s[j];
    }
    sum = exp_sum8(s, keys, m);
    for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_setzero_ps());
    for (int64_t j = 0; j < keys; j++) {
        const void *vj = (const char *)vh + j * d * es;
        prefetch_row(next_v, j, d * es);
        __m256 p = _mm256_set1_ps(s[j]);
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(o + c, _mm256_fmadd_ps(p, kv_load8(vj, c, h16), _mm256_loadu_ps(o + c)));
    }
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), inv));
}

X86 static void attend_x86(const float *qi, const void *kh, const void *vh, int64_t keys, int64_t d,
                           float scale, float *s, float *o, const void *next_k, const void *next_v, int h16) {
    if (h16) attend_x86_kv(qi, kh, vh, keys, d, scale, s, o, next_k, next_v, 1);
    else attend_x86_kv(qi, kh, vh, keys, d, scale, s, o, next_k, next_v, 0);
}
#endif

#if HAVE_X86
/* attend_x86 on AVX-512 for d a multiple of 16 up to 128: a key's dot product in d / 16 FMAs, and the
   output's d values in registers through the weighted sum of the values (attend_x86 adds into memory a
   key at a time): a decode step's attention, a few keys a query, is about its loads. */
#define ATTEND512_D 128
X512 KV_BODY void attend_512_kv(const float *qi, const void *kh, const void *vh, int64_t keys, int64_t d,
                               float scale, float *s, float *o, const void *next_k, const void *next_v, int h16) {
    const int nv = (int)(d / 16);
    const int64_t es = h16 ? 2 : 4;
    __m512 qv[ATTEND512_D / 16], acc[ATTEND512_D / 16];
    for (int c = 0; c < nv; c++) qv[c] = _mm512_loadu_ps(qi + 16 * c);
    float m = -INFINITY;
    for (int64_t j = 0; j < keys; j++) {
        const void *kj = (const char *)kh + j * d * es;
        if (next_k) {  /* a decode row: this head's values, the next head's keys */
            prefetch_row(vh, j, d * es);
            prefetch_row(next_k, j, d * es);
        }
        __m512 a = _mm512_mul_ps(qv[0], kv_load16(kj, 0, h16));
        for (int c = 1; c < nv; c++) a = _mm512_fmadd_ps(qv[c], kv_load16(kj, 16 * c, h16), a);
        s[j] = _mm512_reduce_add_ps(a) * scale;
        m = s[j] > m ? s[j] : m;
    }
    float sum = exp_sum16(s, keys, m);
    for (int c = 0; c < nv; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < keys; j++) {
        const void *vj = (const char *)vh + j * d * es;
        prefetch_row(next_v, j, d * es);
        __m512 p = _mm512_set1_ps(s[j]);
        for (int c = 0; c < nv; c++) acc[c] = _mm512_fmadd_ps(p, kv_load16(vj, 16 * c, h16), acc[c]);
    }
    __m512 inv = _mm512_set1_ps(1.0f / sum);
    for (int c = 0; c < nv; c++) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[c], inv));
}

X512 static void attend_512(const float *qi, const void *kh, const void *vh, int64_t keys, int64_t d,
                            float scale, float *s, float *o, const void *next_k, const void *next_v, int h16) {
    if (h16) attend_512_kv(qi, kh, vh, keys, d, scale, s, o, next_k, next_v, 1);
    else attend_512_kv(qi, kh, vh, keys, d, scale, s, o, next_k, next_v, 0);
}

/* One query's attention on the SIMD path `simd` (d a multiple of 8): attend_512 or attend_x86. next_k, next_v:
   the head attended next, for a decode row whose cache comes from memory: then this head's values and the
   next head are fetched ahead (see prefetch_row); NULL for a prompt's queries, which read their head again. */
X86 static void attend_simd(int simd, const float *qi, const void *kh, const void *vh, int64_t keys, int64_t d,
                            float scale, float *s, float *o, const void *next_k, const void *next_v, int h16) {
    if (simd == PATH_AVX512 && d % 16 == 0 && d <= ATTEND512_D)
        attend_512(qi, kh, vh, keys, d, scale, s, o, next_k, next_v, h16);
    else attend_x86(qi, kh, vh, keys, d, scale, s, o, next_k, next_v, h16);
}
#endif

#if HAVE_X86
/* How many query heads of a group (grouped-query attention: query heads that read the same key/value head)
   attend_group takes in one pass: on AVX-512 up to 4 at d = 64 and 2 at d = 128 (g * d / 16 sums stay in
   registers through the V pass), on AVX2 up to 4 at any d (its sums in memory, as attend_x86's). */
#define GROUP_MAX 4
static int64_t group_most(int simd, int64_t d) {
    if (simd == PATH_AVX2) return d % 8 == 0 ? GROUP_MAX : 1;  /* attend_group_x86: sums in memory */
    return simd != PATH_AVX512 ? 1 : d == 64 ? GROUP_MAX : d == 128 ? 2 : 1;
}

/* attend_x86_kv for g query heads of one group (as attend_group_kv; d a multiple of 8): each key and value
   row loaded once for the g, every query's arithmetic attend_x86_kv's in its order (the same bits). g is a
   constant where attend_group_x86 calls it. */
X86 KV_BODY void attend_group_x86_kv(const int g, const float *q, int64_t q_h, const void *kh, const void *vh,
                                     int64_t keys, int64_t d, float scale, float *s, int64_t s_h, float *o,
                                     int64_t o_h, const void *next_k, const void *next_v, int h16) {
    const int64_t es = h16 ? 2 : 4;
    float m[GROUP_MAX], sum[GROUP_MAX];
    for (int i = 0; i < g; i++) m[i] = -INFINITY;
    for (int64_t j = 0; j < keys; j++) {
        const void *kj = (const char *)kh + j * d * es;
        if (next_k) {  /* a decode row: this head's values, the next head's keys */
            prefetch_row(vh, j, d * es);
            prefetch_row(next_k, j, d * es);
        }
        __m256 a0[GROUP_MAX], a1[GROUP_MAX];  /* dot_x86's two sums, for each query */
        for (int i = 0; i < g; i++) a0[i] = a1[i] = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 16 <= d; c += 16) {
            __m256 k0 = kv_load8(kj, c, h16), k1 = kv_load8(kj, c + 8, h16);
            for (int i = 0; i < g; i++) {
                a0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * q_h + c), k0, a0[i]);
                a1[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * q_h + c + 8), k1, a1[i]);
            }
        }
        if (c < d) {
            __m256 k0 = kv_load8(kj, c, h16);
            for (int i = 0; i < g; i++) a0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * q_h + c), k0, a0[i]);
        }
        for (int i = 0; i < g; i++) {
            float sc = hsum(_mm256_add_ps(a0[i], a1[i])) * scale;
            s[i * s_h + j] = sc;
            if (sc > m[i]) m[i] = sc;
        }
    }
    for (int i = 0; i < g; i++) {
        float *oi = o + i * o_h;
        sum[i] = exp_sum8(s + i * s_h, keys, m[i]);
        for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(oi + c, _mm256_setzero_ps());
    }
    for (int64_t j = 0; j < keys; j++) {
        const void *vj = (const char *)vh + j * d * es;
        prefetch_row(next_v, j, d * es);
        __m256 p[GROUP_MAX];
        for (int i = 0; i < g; i++) p[i] = _mm256_set1_ps(s[i * s_h + j]);
        for (int64_t c = 0; c < d; c += 8) {
            __m256 vc = kv_load8(vj, c, h16);
            for (int i = 0; i < g; i++)
                _mm256_storeu_ps(o + i * o_h + c, _mm256_fmadd_ps(p[i], vc, _mm256_loadu_ps(o + i * o_h + c)));
        }
    }
    for (int i = 0; i < g; i++) {
        __m256 inv = _mm256_set1_ps(1.0f / sum[i]);
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(o + i * o_h + c, _mm256_mul_ps(_mm256_loadu_ps(o + i * o_h + c), inv));
    }
}

/* attend_group_x86_kv with g (2 .. GROUP_MAX) and h16 constants. */
X86 static void attend_group_x86(int64_t g, const float *q, int64_t q_h, const void *kh, const void *vh,
                                 int64_t keys, int64_t d, float scale, float *s, int64_t s_h, float *o, int64_t o_h,
                                 const void *next_k, const void *next_v, int h16) {
#define GROUP_X86(G) \
    if (g == G) { \
        if (h16) attend_group_x86_kv(G, q, q_h, kh, vh, keys, d, scale, s, s_h, o, o_h, next_k, next_v, 1); \
        else attend_group_x86_kv(G, q, q_h, kh, vh, keys, d, scale, s, s_h, o, o_h, next_k, next_v, 0); \
        return; \
    }
    GROUP_X86(2) GROUP_X86(3) GROUP_X86(4)
}

/* attend_512_kv for g query heads of one group over their key/value head (query i at q + i * q_h, its scores
   at s + i * s_h, its result at o + i * o_h; nv = d / 16): each key and value row is loaded once for all g
   (attend_512_kv, a query at a time, loads them g times), and the V pass runs g * nv independent sums
   (attend_512_kv's nv are each a chain of FMAs a key long). Each query's arithmetic is attend_512_kv's, in
   its order: the same bits. g and nv are constants where attend_group_512 calls it. */
X512 KV_BODY void attend_group_kv(const int g, const int nv, const float *q, int64_t q_h, const void *kh,
                                  const void *vh, int64_t keys, float scale, float *s, int64_t s_h, float *o,
                                  int64_t o_h, const void *next_k, const void *next_v, int h16) {
    const int64_t d = 16 * nv, es = h16 ? 2 : 4;
    __m512 qv[GROUP_MAX][ATTEND512_D / 16], acc[GROUP_MAX][ATTEND512_D / 16], kc[ATTEND512_D / 16];
    float m[GROUP_MAX], sum[GROUP_MAX];
    for (int i = 0; i < g; i++) {
        m[i] = -INFINITY;
        for (int c = 0; c < nv; c++) qv[i][c] = _mm512_loadu_ps(q + i * q_h + 16 * c);
    }
    for (int64_t j = 0; j < keys; j++) {
        const void *kj = (const char *)kh + j * d * es;
        if (next_k) {  /* a decode row: this head's values, the next head's keys */
            prefetch_row(vh, j, d * es);
            prefetch_row(next_k, j, d * es);
        }
        for (int c = 0; c < nv; c++) kc[c] = kv_load16(kj, 16 * c, h16);
        for (int i = 0; i < g; i++) {
            __m512 a = _mm512_mul_ps(qv[i][0], kc[0]);
            for (int c = 1; c < nv; c++) a = _mm512_fmadd_ps(qv[i][c], kc[c], a);
            float sc = _mm512_reduce_add_ps(a) * scale;
            s[i * s_h + j] = sc;
            m[i] = sc > m[i] ? sc : m[i];
        }
    }
    for (int i = 0; i < g; i++) {
        sum[i] = exp_sum16(s + i * s_h, keys, m[i]);
        for (int c = 0; c < nv; c++) acc[i][c] = _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < keys; j++) {
        const void *vj = (const char *)vh + j * d * es;
        prefetch_row(next_v, j, d * es);
        for (int c = 0; c < nv; c++) kc[c] = kv_load16(vj, 16 * c, h16);
        for (int i = 0; i < g; i++) {
            __m512 p = _mm512_set1_ps(s[i * s_h + j]);
            for (int c = 0; c < nv; c++) acc[i][c] = _mm512_fmadd_ps(p, kc[c], acc[i][c]);
        }
    }
    for (int i = 0; i < g; i++) {
        __m512 inv = _mm512_set1_ps(1.0f / sum[i]);
        for (int c = 0; c < nv; c++) _mm512_storeu_ps(o + i * o_h + 16 * c, _mm512_mul_ps(acc[i][c], inv));
    }
}

/* attend_group_kv for the (g, d) it has a copy for; returns 0 when there is none. */
X512 static int attend_group_512(int64_t g, const float *q, int64_t q_h, const void *kh, const void *vh,
                                 int64_t keys, int64_t d, float scale, float *s, int64_t s_h, float *o, int64_t o_h,
                                 const void *next_k, const void *next_v, int h16) {
#define GROUP_CASE(G, NV) \
    if (g == G && d == 16 * NV) { \
        if (h16) attend_group_kv(G, NV, q, q_h, kh, vh, keys, scale, s, s_h, o, o_h, next_k, next_v, 1); \
        else attend_group_kv(G, NV, q, q_h, kh, vh, keys, scale, s, s_h, o, o_h, next_k, next_v, 0); \
        return 1; \
    }
    GROUP_CASE(2, 4) GROUP_CASE(3, 4) GROUP_CASE(4, 4) GROUP_CASE(2, 8)
    return 0;
}

/* g query heads of one group (1 <= g <= group_most(simd, d)) on the SIMD path `simd`: attend_group_512 where
   it has a copy for (g, d), else attend_simd a query at a time (the same bits either way). */
X86 static void attend_group(int simd, int64_t g, const float *q, int64_t q_h, const void *kh, const void *vh,
                             int64_t keys, int64_t d, float scale, float *s, int64_t s_h, float *o, int64_t o_h,
                             const void *next_k, const void *next_v, int h16) {
    if (simd == PATH_AVX512 && g > 1
        && attend_group_512(g, q, q_h, kh, vh, keys, d, scale, s, s_h, o, o_h, next_k, next_v, h16))
        return;
    if (simd == PATH_AVX2 && g > 1 && d % 8 == 0) {
        attend_group_x86(g, q, q_h, kh, vh, keys, d, scale, s, s_h, o, o_h, next_k, next_v, h16);
        return;
    }
    for (int64_t i = 0; i < g; i++)  /* the next head's rows for the last query of the group only */
        attend_simd(simd, q + i * q_h, kh, vh, keys, d, scale, s + i * s_h, o + i * o_h, i + 1 == g ? next_k : NULL,
                    i + 1 == g ? next_v : NULL, h16);
}
#endif

/* Scores per query on the stack up to this many keys (16 KB), else on the heap. */
#define STACK_KEYS 4096

/* One query over `keys` keys, portable C: one pass with a running maximum (online softmax), so no score
   buffer. */
KV_BODY void attend_portable_kv(const float *qi, const void *kh, const void *vh, int64_t keys, int64_t d,
                                float scale, float *o, int h16) {
    const int64_t es = h16 ? 2 : 4;
    float m = -INFINITY, sum = 0.0f;
    for (int64_t c = 0; c < d; c++) o[c] = 0.0f;
    for (int64_t j = 0; j < keys; j++) {
        const void *kj = (const char *)kh + j * d * es, *vj = (const char *)vh + j * d * es;
        float s = 0.0f;
        for (int64_t c = 0; c < d; c++) s += qi[c] * kv_at(kj, c, h16);
        s *= scale;
        if (s > m) {  /* a new maximum: rescale what was summed so far */
            float f = expf(m - s);
            sum *= f;
            for (int64_t c = 0; c < d; c++) o[c] *= f;
            m = s;
        }
        float e = expf(s - m);
        sum += e;
        for (int64_t c = 0; c < d; c++) o[c] += e * kv_at(vj, c, h16);
    }
    for (int64_t c = 0; c < d; c++) o[c] /= sum;
}

static void attend_portable(const float *qi, const void *kh, const void *vh, int64_t keys, int64_t d,
                            float scale, float *o, int h16) {
    if (h16) attend_portable_kv(qi, kh, vh, keys, d, scale, o, 1);
    else attend_portable_kv(qi, kh, vh, keys, d, scale, o, 0);
}

/* Causal attention of b sequences with h query heads of size d over hkv key/value heads (h a multiple of
   hkv: grouped-query attention, query head `head` reads key/value head head / (h / hkv); hkv = h is plain
   multi-head attention): the caches k and v are [b, hkv, l, d]; the t
   queries of each sequence sit at positions offset .. offset + t - 1 and query i attends keys
   0 .. offset + i. Query (s, head, i) is read at q + s * q_s + head * q_h + i * q_t and its result
   written at out + s * o_s + head * o_h + i * o_t (strides in floats), so that the caller's layout,
   [b, h, t, d] or a fused [b, t, 3, h, d], needs no copy. The caches hold float32, or float16 (h16). */
static void attend_all(int64_t b, int64_t h, int64_t hkv, int64_t t, int64_t d, const float *q, int64_t q_s,
                       int64_t q_h, int64_t q_t, const void *k, const void *v, int64_t l, int64_t offset,
                       float *out, int64_t o_s, int64_t o_h, int64_t o_t, int threads, int h16) {
    int64_t group = h / hkv, es = h16 ? 2 : 4;
    float scale = 1.0f / sqrtf((float)d);
    int simd = HAVE_X86 && d % 8 == 0 && simd_path();
    float *heap = NULL;
    if (simd && offset + t > STACK_KEYS) {
        heap = malloc(sizeof(float) * (size_t)(offset + t) * (size_t)(b * h * t));
        if (!heap) simd = 0;  /* out of memory: the portable path needs no buffer */
    }
    (void)threads; (void)simd;
#if HAVE_X86
    int64_t most = simd && t == 1 ? min64(group, group_most(simd_path(), d)) : 1;
    if (most > 1) {
        /* A decode step of grouped-query attention: each thread takes one run of the b * h query heads (as
           below) and attends the heads of a group that fall in it `most` at a time (attend_group). */
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1 && (offset + t) * h * b >= 512)
#endif
        {
            float buf[GROUP_MAX * STACK_KEYS];
            int64_t first, end, keys = offset + 1;
            my_share(b * h, &first, &end);
            for (int64_t n = first, g; n < end; n += g) {
                int64_t seq = n / h, head = n % h, kvh = seq * hkv + head / group;
                g = min64(min64(most, end - n), group - head % group);
                const void *kh = (const char *)k + kvh * l * d * es, *vh = (const char *)v + kvh * l * d * es;
                /* the next run's key/value head, when it is another one */
                int64_t nn = n + g, next = nn / h * hkv + nn % h / group;
                const void *nk = nn < b * h && next != kvh ? (const char *)k + next * l * d * es : NULL;
                const void *nv = nk ? (const char *)v + next * l * d * es : NULL;
                attend_group(simd_path(), g, q + seq * q_s + head * q_h, q_h, kh, vh, keys, d, scale,
                             heap ? heap + n * keys : buf, keys, out + seq * o_s + head * o_h, o_h, nk, nv, h16);
            }
        }
        free(heap);
        return;
    }
#endif
    /* Split among the threads from ~43 keys a head at 12 heads: a decode step's attention reads its
       cache from memory (evicted by the weights), and two threads made the whole step measurably
       faster (docs/benchmarks.md). */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads > 1 && (offset + t) * t * h * b >= 512)
#endif
    for (int64_t n = 0; n < b * h * t; n++) {
        int64_t seq = n / (h * t), head = n / t % h, i = n % t, keys = offset + i + 1;
        const float *qi = q + seq * q_s + head * q_h + i * q_t;
        int64_t kvh = seq * hkv + head / group;
        const void *kh = (const char *)k + kvh * l * d * es, *vh = (const char *)v + kvh * l * d * es;
        float *o = out + seq * o_s + head * o_h + i * o_t;
#if HAVE_X86
        if (simd) {
            float buf[STACK_KEYS];
            /* the next item's head, when it is another one (a decode step: t = 1) */
            int64_t next = kvh + (head + 1) / group - head / group;
            const void *nk = t == 1 && n + 1 < b * h && next != kvh ? (const char *)k + next * l * d * es : NULL;
            const void *nv = nk ? (const char *)v + next * l * d * es : NULL;
            attend_simd(simd_path(), qi, kh, vh, keys, d, scale, heap ? heap + n * (offset + t) : buf, o, nk, nv,
                        h16);
            continue;
        }
#endif
        attend_portable(qi, kh, vh, keys, d, scale, o, h16);
    }
    free(heap);
}

#if HAVE_X86
/* e^x, 16 at a time: exp8's Cephes expf lane for lane. */
X512 static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(n));
}

/* Queries in tiles of QT for the blocked attention of a long prompt. */
#define QT 12

/* QT queries (rows of a prompt, the first `mr` real, packed input-major in qp [d][QT]) of one head over
   its keys: kt the keys transposed [d][lk] (zero past the last), v [keys][d]. Row r attends keys
   0 .. first + r - 1. Scores by 16 keys at a time (an outer product over d, as the weight tiles), an
   exact softmax per row, then P @ V by 32 columns of d. s: [QT][lk], pt: [lk][QT] scratch. Out row r at
   out + r * o_stride. d: a multiple of 16. */
X512 static void attend_tile512(const float *qp, const float *kt, int64_t lk, const float *v, int64_t d,
                                int64_t first, int mr, float scale, float *s, float *pt, float *out,
                                int64_t o_stride) {
    int64_t keys = first + mr - 1;
    __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t j0 = 0; j0 < keys; j0 += 16) {
        __m512 acc[QT];
#pragma GCC unroll 12
        for (int r = 0; r < QT; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t c = 0; c < d; c++) {
            __m512 kv = _mm512_loadu_ps(kt + c * lk + j0);
#pragma GCC unroll 12
            for (int r = 0; r < QT; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qp[c * QT + r]), kv, acc[r]);
        }
        for (int r = 0; r < mr; r++) _mm512_storeu_ps(s + r * lk + j0, _mm512_mul_ps(acc[r], vscale));
    }
    float inv[QT];
    for (int r = 0; r < QT; r++) {
        inv[r] = 0.0f;
        int64_t n = r < mr ? first + r : 0;
        float *sr = s + r * lk;
        __m512 vm = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(sr + j));
        float m = _mm512_reduce_max_ps(vm);
        for (; j < n; j++) m = sr[j] > m ? sr[j] : m;
        float sum = exp_sum16(sr, n, m);
        for (j = 0; j < n; j++) pt[j * QT + r] = sr[j];
        for (; j < keys; j++) pt[j * QT + r] = 0.0f;
        if (n) inv[r] = 1.0f / sum;
    }
    for (int64_t c0 = 0; c0 < d; c0 += 32) {
        int two = c0 + 32 <= d;
        __m512 acc[QT][2];
#pragma GCC unroll 12
        for (int r = 0; r < QT; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int64_t j = 0; j < keys; j++) {
            __m512 v0 = _mm512_loadu_ps(v + j * d + c0), v1 = two ? _mm512_loadu_ps(v + j * d + c0 + 16) : v0;
#pragma GCC unroll 12
            for (int r = 0; r < QT; r++) {
                __m512 p = _mm512_set1_ps(pt[j * QT + r]);
                acc[r][0] = _mm512_fmadd_ps(p, v0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(p, v1, acc[r][1]);
            }
        }
        for (int r = 0; r < mr; r++) {
            __m512 f = _mm512_set1_ps(inv[r]);
            _mm512_storeu_ps(out + r * o_stride + c0, _mm512_mul_ps(acc[r][0], f));
            if (two) _mm512_storeu_ps(out + r * o_stride + c0 + 16, _mm512_mul_ps(acc[r][1], f));
        }
    }
}

/* attend_tile512 in AVX2 (d: a multiple of 8): the scores by 8 keys at a time, P @ V by 8 columns of d
   (QT accumulators and two operands fill AVX2's 16 registers). */
X86 static void attend_tile256(const float *qp, const float *kt, int64_t lk, const float *v, int64_t d,
                               int64_t first, int mr, float scale, float *s, float *pt, float *out,
                               int64_t o_stride) {
    int64_t keys = first + mr - 1;
    __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t j0 = 0; j0 < keys; j0 += 8) {
        __m256 acc[QT];
#pragma GCC unroll 12
        for (int r = 0; r < QT; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t c = 0; c < d; c++) {
            __m256 kv = _mm256_loadu_ps(kt + c * lk + j0);
#pragma GCC unroll 12
            for (int r = 0; r < QT; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(qp[c * QT + r]), kv, acc[r]);
        }
        for (int r = 0; r < mr; r++) _mm256_storeu_ps(s + r * lk + j0, _mm256_mul_ps(acc[r], vscale));
    }
    float inv[QT];
    for (int r = 0; r < QT; r++) {
        inv[r] = 0.0f;
        int64_t n = r < mr ? first + r : 0;
        float *sr = s + r * lk;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(sr + j));
        float m = hmax(vm);
        for (; j < n; j++) m = sr[j] > m ? sr[j] : m;
        float sum = exp_sum8(sr, n, m);
        for (j = 0; j < n; j++) pt[j * QT + r] = sr[j];
        for (; j < keys; j++) pt[j * QT + r] = 0.0f;
        if (n) inv[r] = 1.0f / sum;
    }
    for (int64_t c0 = 0; c0 < d; c0 += 8) {
        __m256 acc[QT];
#pragma GCC unroll 12
        for (int r = 0; r < QT; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < keys; j++) {
            __m256 v0 = _mm256_loadu_ps(v + j * d + c0);
#pragma GCC unroll 12
            for (int r = 0; r < QT; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(pt[j * QT + r]), v0, acc[r]);
        }
        for (int r = 0; r < mr; r++)
            _mm256_storeu_ps(out + r * o_stride + c0, _mm256_mul_ps(acc[r], _mm256_set1_ps(inv[r])));
    }
}
#endif

/* Causal attention of a long prompt (AVX-512 with d a multiple of 16, or AVX2 with d a multiple of 8:
   `simd`): as attend_all's arguments, in tiles of QT queries of one head, each tile a few
   register-blocked products instead of QT dot-product loops. Returns 0, or -1 out of memory (then
   nothing is computed). */
static int attend_blocked(int simd, int64_t b, int64_t h, int64_t hkv, int64_t t, int64_t d, const float *q, int64_t q_s,
                          int64_t q_h, int64_t q_t, const float *k, const float *v, int64_t l, int64_t offset,
                          float *out, int64_t o_s, int64_t o_h, int64_t o_t, int threads) {
#if HAVE_X86
    /* hkv key/value heads (h a multiple of it): query head `head` reads kv head head / (h / hkv), whose
       keys are transposed once for the whole group. */
    int64_t keys = offset + t, lk = (keys + 15) / 16 * 16, tiles = (t + QT - 1) / QT, group = h / hkv;
    float *kt = calloc((size_t)(b * hkv * d * lk), sizeof(float));
    if (!kt) return -1;
    float scale = 1.0f / sqrtf((float)d);
    int failed = 0;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1)
#endif
    {
        float *scratch = malloc(sizeof(float) * (size_t)(2 * QT * lk + d * QT));
        if (!scratch) failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t bh = 0; bh < b * hkv; bh++) {
            const float *kh = k + bh * l * d;
            float *dst = kt + bh * d * lk;
            for (int64_t j = 0; j < keys; j++)
                for (int64_t c = 0; c < d; c++) dst[c * lk + j] = kh[j * d + c];
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t item = 0; item < b * h * tiles; item++) {
            if (!scratch) continue;
            int64_t bh = item / tiles, tile = tiles - 1 - item % tiles, seq = bh / h, head = bh % h;
            int64_t kv = seq * hkv + head / group;  /* its key/value head */
            int64_t i0 = tile * QT;
            int mr = (int)(t - i0 < QT ? t - i0 : QT);
            float *s = scratch, *pt = scratch + QT * lk, *qp = pt + QT * lk;
            for (int64_t c = 0; c < d; c++)
                for (int r = 0; r < QT; r++)
                    qp[c * QT + r] = r < mr ? q[seq * q_s + head * q_h + (i0 + r) * q_t + c] : 0.0f;
            if (simd == PATH_AVX512)
                attend_tile512(qp, kt + kv * d * lk, lk, v + kv * l * d, d, offset + i0 + 1, mr, scale, s, pt,
                               out + seq * o_s + head * o_h + i0 * o_t, o_t);
            else
                attend_tile256(qp, kt + kv * d * lk, lk, v + kv * l * d, d, offset + i0 + 1, mr, scale, s, pt,
                               out + seq * o_s + head * o_h + i0 * o_t, o_t);
        }
        free(scratch);
    }
    free(kt);
    return failed ? -1 : 0;
#else
    (void)simd; (void)b; (void)h; (void)hkv; (void)t; (void)d; (void)q; (void)q_s; (void)q_h; (void)q_t; (void)k; (void)v;
    (void)l;
    (void)offset; (void)out; (void)o_s; (void)o_h; (void)o_t; (void)threads;
    return -1;
#endif
}

/* --------------------------------------------------------------------------- attention in bfloat16
   A long prompt's attention with bfloat16 products summed in float32, as PyTorch's bfloat16 attention
   runs on this hardware: the queries, keys, values and the softmax weights rounded to bfloat16 (to
   nearest even), the scores, the softmax and every sum float32. Per 16 queries of a head: S = Q K^T, an
   exact softmax per row in AVX-512 (exp16), then P V. Two paths, the same roundings (their sums differ
   in order only): AMX-BF16 tiles (TDPBF16PS, 16 x 32 by 32 x 16 products), and where the CPU has
   AVX512-BF16 but no AMX (AMD Zen 4 and 5), VDPBF16PS (16 pairs of products a vector). The keys and
   values of each key/value head are packed once, in the pair layout both take: kt [d / 2][lk][2],
   vt [lk / 2][d][2]. */
#if HAVE_X86 && defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define HAVE_BF16 1
#else
#define HAVE_BF16 0
#endif
#define BF16_AVX512 1
#define BF16_AMX 2

#if HAVE_BF16
#define X512B __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

static int cpu_has_avx512_bf16(void) { return cpu_has_avx512() && (cpuid7(1)[0] & (1u << 5)); }

/* 16 float32 → bfloat16 (nearest, ties to even, as to_bf16), each in the low half of a 32-bit lane. */
X512 static inline __m512i bf16_lanes(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    return _mm512_srli_epi32(r, 16);
}

/* 16 float32 → 16 bfloat16 side by side. */
X512 static inline __m256i to_bf16x16(__m512 v) { return _mm512_cvtepi32_epi16(bf16_lanes(v)); }

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* The softmax of a tile's scores, both paths': row r of s [16][lk] (its first + r scores; none past mr)
   scaled, its exponentials (less the row's largest) rounded to bfloat16 into pb [16][lk] (zero from the
   row's end up to nk), and 1 / their float32 sum in inv[r] (0 for rows past mr). */
X512 static void softmax_rows_bf16(float *s, uint16_t *pb, int64_t lk, int64_t first, int mr, int64_t nk,
                                   float scale, float *inv) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int r = 0; r < 16; r++) {
        int64_t n = r < mr ? first + r : 0;
        float *sr = s + r * lk;
        uint16_t *pr = pb + r * lk;
        __m512 vm = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sr + j), vscale);
            _mm512_storeu_ps(sr + j, x);
            vm = _mm512_max_ps(vm, x);
        }
        float m = _mm512_reduce_max_ps(vm);
        for (; j < n; j++) { sr[j] *= scale; m = sr[j] > m ? sr[j] : m; }
        __m512 vs = _mm512_setzero_ps();
        vm = _mm512_set1_ps(m);
        for (j = 0; j + 16 <= n; j += 16) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + j), vm));
            vs = _mm512_add_ps(vs, e);
            _mm256_storeu_si256((__m256i *)(pr + j), to_bf16x16(e));
        }
        float sum = _mm512_reduce_add_ps(vs);
        for (; j < n; j++) { float e = expf(sr[j] - m); sum += e; pr[j] = to_bf16(e); }
        for (; j < nk; j++) pr[j] = 0;
        inv[r] = n ? 1.0f / sum : 0.0f;
    }
}

/* One tile of up to 16 queries (the first mr real) of a head over keys 0 .. first + mr - 2 (row r sees
   first + r of them) on AVX512-BF16: qp [d / 2][16] the queries' pairs of bfloat16, pair-major (zero past
   mr); kt, vt the packed keys and values of its key/value head (lk keys, a multiple of 32, zero past the
   last). S by 16 keys, the 16 rows' sums in registers, each VDPBF16PS 16 keys' pairs by one query's pair
   (broadcast); P V by 16 outputs, each two keys' values by a pair of a row's weights, the weights
   transposed pair-major first (pt) so that the 16 rows' broadcasts share one pointer. s [16][lk] float32,
   pb [16][lk] bfloat16, pt [lk / 2][16] pairs: scratch. Out row r at out + r * o_stride. d a multiple of
   32. */
X512B static void attend_tile_dpbf16(const uint32_t *qp, const uint16_t *kt, const uint16_t *vt, int64_t lk,
                                     int64_t d, int64_t first, int mr, float scale, float *s, uint16_t *pb,
                                     uint32_t *pt, float *out, int64_t o_stride) {
    int64_t keys = first + mr - 1, nk = (keys + 31) / 32 * 32, pairs = d / 2;
    const uint32_t *kp = (const uint32_t *)kt;
    for (int64_t j0 = 0; j0 < keys; j0 += 16) {
        __m512 acc[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t c = 0; c < pairs; c++) {
            __m512bh kv = (__m512bh)_mm512_loadu_si512((const void *)(kp + c * lk + j0));
            const uint32_t *qc = qp + c * 16;
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) acc[r] = _mm512_dpbf16_ps(acc[r], kv, (__m512bh)_mm512_set1_epi32((int)qc[r]));
        }
        for (int r = 0; r < mr; r++) _mm512_storeu_ps(s + r * lk + j0, acc[r]);
    }
    float inv[16];
    softmax_rows_bf16(s, pb, lk, first, mr, nk, scale, inv);
    int64_t kpairs = (keys + 1) / 2;  /* pb is zero past each row's keys */
    const uint32_t *pp = (const uint32_t *)pb;
    for (int64_t jp = 0; jp < kpairs; jp++)
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) pt[jp * 16 + r] = pp[r * (lk / 2) + jp];
    const uint32_t *vp = (const uint32_t *)vt;
    for (int64_t c0 = 0; c0 < d; c0 += 16) {
        __m512 acc[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t jp = 0; jp < kpairs; jp++) {
            __m512bh vv = (__m512bh)_mm512_loadu_si512((const void *)(vp + jp * d + c0));
            const uint32_t *pj = pt + jp * 16;
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) acc[r] = _mm512_dpbf16_ps(acc[r], vv, (__m512bh)_mm512_set1_epi32((int)pj[r]));
        }
        for (int r = 0; r < mr; r++)
            _mm512_storeu_ps(out + r * o_stride + c0, _mm512_mul_ps(acc[r], _mm512_set1_ps(inv[r])));
    }
}
#endif

#if HAVE_AMX
#ifdef INFERNO_HALF_EMULATE_AMX
#define XAMXB X512
#else
#define XAMXB __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

/* Why the bfloat16 tiles cannot run here ("" when they can): AMX's checks, and AMX-BF16. */
static const char *amx_bf16_check(void) {
    if (amx_min_rows == 0) return "AMX is switched off (amx_rows(0), INFERNO_HALF_ISA=avx512)";
#ifndef INFERNO_HALF_EMULATE_AMX
    if (!(cpuid7(0)[3] & (1u << 22))) return "CPU lacks AMX-BF16";
#endif
    return amx_support();
}

/* The store of a float32 sums tile T (16 x 16) to s, 64 bytes a row. */
#ifdef INFERNO_HALF_EMULATE_AMX
#define AMX_STORE_F(T, s) emu_tile_stored(T, s, 64)
#else
#define AMX_STORE_F(T, s) \
    __asm__ volatile("{tilestored\t%%tmm" #T ", (%1,%2,1)|tilestored\t[%1+%2*1], %%tmm" #T "}" \
                     : "=m"(*(float(*)[256])(s)) : "r"(s), "r"((long)64))
#endif

/* attend_tile_dpbf16 on AMX-BF16 tiles: S by 64 keys (d / 32 tile products into each of four sums
   tiles), P V by 32 keys into up to 4 tiles of 16 outputs. ob [4][256] float32: scratch. */
XAMXB static void attend_tile_amx(const uint16_t *qb, const uint16_t *kt, const uint16_t *vt, int64_t lk, int64_t d,
                                  int64_t first, int mr, float scale, float *s, uint16_t *pb, float *ob, float *out,
                                  int64_t o_stride) {
    int64_t keys = first + mr - 1, nk = (keys + 31) / 32 * 32;
    _tile_loadconfig(&AMX_FULL_CONFIG);
    /* S by 64 keys: four sums tiles (2, 5, 6, 7) in flight, a chunk of the queries loaded once for them */
    for (int64_t j0 = 0; j0 < keys; j0 += 64) {
        int parts = (int)min64(4, (nk - j0) / 16);
        _tile_zero(2); _tile_zero(5); _tile_zero(6); _tile_zero(7);
        for (int64_t c0 = 0; c0 < d; c0 += 32) {
            const uint16_t *kc = kt + (c0 / 2) * lk * 2 + j0 * 2;
            _tile_loadd(0, qb + c0, d * 2);
            _tile_loadd(1, kc, lk * 4);
            _tile_dpbf16ps(2, 0, 1);
            if (parts > 1) { _tile_loadd(4, kc + 32, lk * 4); _tile_dpbf16ps(5, 0, 4); }
            if (parts > 2) { _tile_loadd(1, kc + 64, lk * 4); _tile_dpbf16ps(6, 0, 1); }
            if (parts > 3) { _tile_loadd(4, kc + 96, lk * 4); _tile_dpbf16ps(7, 0, 4); }
        }
        _tile_stored(2, s + j0, lk * 4);
        if (parts > 1) _tile_stored(5, s + j0 + 16, lk * 4);
        if (parts > 2) _tile_stored(6, s + j0 + 32, lk * 4);
        if (parts > 3) _tile_stored(7, s + j0 + 48, lk * 4);
    }
    float inv[16];
    softmax_rows_bf16(s, pb, lk, first, mr, nk, scale, inv);
    for (int64_t c0 = 0; c0 < d; c0 += 64) {
        int parts = (int)min64(4, (d - c0) / 16);
        _tile_zero(2); _tile_zero(5); _tile_zero(6); _tile_zero(7);
        for (int64_t j0 = 0; j0 < nk; j0 += 32) {
            _tile_loadd(3, pb + j0, lk * 2);
            const uint16_t *vrow = vt + (j0 / 2) * d * 2 + c0 * 2;
            _tile_loadd(4, vrow, d * 4);
            _tile_dpbf16ps(2, 3, 4);
            if (parts > 1) { _tile_loadd(4, vrow + 32, d * 4); _tile_dpbf16ps(5, 3, 4); }
            if (parts > 2) { _tile_loadd(4, vrow + 64, d * 4); _tile_dpbf16ps(6, 3, 4); }
            if (parts > 3) { _tile_loadd(4, vrow + 96, d * 4); _tile_dpbf16ps(7, 3, 4); }
        }
        AMX_STORE_F(2, ob);
        if (parts > 1) AMX_STORE_F(5, ob + 256);
        if (parts > 2) AMX_STORE_F(6, ob + 512);
        if (parts > 3) AMX_STORE_F(7, ob + 768);
        for (int r = 0; r < mr; r++) {
            __m512 f = _mm512_set1_ps(inv[r]);
            for (int u = 0; u < parts; u++)
                _mm512_storeu_ps(out + r * o_stride + c0 + 16 * u, _mm512_mul_ps(_mm512_loadu_ps(ob + 256 * u + 16 * r), f));
        }
    }
    _tile_release();
}
#endif

/* Which path attention(..., bf16=True) takes now for a long prompt: BF16_AMX, BF16_AVX512 or 0 (then it
   runs in float32); *why says why not AMX-BF16 ("" when it runs), or why neither. */
static int bf16_attention_path(const char **why) {
    if (simd_path() != PATH_AVX512) {
        *why = "a lesser path than AVX-512 runs";
        return 0;
    }
#if HAVE_AMX
    *why = amx_bf16_check();
    if (!(*why)[0]) return BF16_AMX;
#else
    *why = "the compiler that built the kernels lacks AMX";
#endif
#if HAVE_BF16
    if (cpu_has_avx512_bf16()) return BF16_AVX512;
    *why = "CPU lacks AVX512-BF16 and AMX-BF16";
#endif
    return 0;
}

/* ------------------------------------------------------------------------------- bfloat16 inputs
   dtype=bfloat16's products with their inputs rounded to bfloat16 too (nearest even; the backend's
   inputs=bfloat16), as PyTorch's bfloat16 computes: VDPBF16PS multiplies 16 lanes of two bfloat16 pairs and
   adds both products to float32 sums, twice float32 FMAs' multiply-adds an instruction. Each output is one
   chain over the input pairs in order, the same for any number of rows, so a row gets the same bits
   alone or batched. The weights are FMT_BF16P's: paired once at load, in the layout both this
   instruction and AMX-BF16's tiles take, so no product shuffles them (pairing them each call cost a
   one-row product on the tiles more than its multiply-adds). Where the CPU lacks AVX512-BF16 (or a
   lesser path is forced) the products take float32 inputs on the weights unpaired (product_unpaired):
   bf16_products() says which. */

/* Whether inputs=bfloat16 runs on VDPBF16PS here: "" if so, else why not. */
static const char *bf16_products_check(void) {
    if (simd_path() != PATH_AVX512) return "a lesser path than AVX-512 runs";
#if HAVE_BF16
    return cpu_has_avx512_bf16() ? "" : "CPU lacks AVX512-BF16";
#else
    return "the compiler that built the kernels lacks AVX512-BF16";
#endif
}

#if HAVE_BF16
/* `mr` rows (up to MR_MAX) of one panel: xb [kh][mr] their inputs' bfloat16 pairs (input-major), w the
   paired panel [kh][32][2]. The end (bias, gelu) through finish8, as the other paths. */
X512B static INLINE void tile_in16(const uint32_t *xb, int64_t k, const uint16_t *w, const int mr, const float *b,
                                   float *y, int64_t n, int64_t col0, int act) {
    __m512 acc[MR_MAX][2];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < (k + 1) / 2; i++) {
        _mm_prefetch((const char *)(w + 2 * i * PANEL) + 2 * PREFETCH, _MM_HINT_T0);
        /* 32-bit lane t: (input 2i, input 2i + 1) of output t (lo) or 16 + t (hi) */
        __m512bh lo = (__m512bh)_mm512_loadu_si512((const void *)(w + 2 * i * PANEL));
        __m512bh hi = (__m512bh)_mm512_loadu_si512((const void *)(w + 2 * i * PANEL + PANEL));
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[i * mr + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], lo, xv);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], hi, xv);
        }
    }
    for (int r = 0; r < mr; r++) {
        __m512 o0 = acc[r][0], o1 = acc[r][1];
        finish8(_mm512_castps512_ps256(o0), b, y + r * n, col0, n, act);
        finish8(_mm512_extractf32x8_ps(o0, 1), b, y + r * n, col0 + 8, n, act);
        finish8(_mm512_castps512_ps256(o1), b, y + r * n, col0 + 16, n, act);
        finish8(_mm512_extractf32x8_ps(o1, 1), b, y + r * n, col0 + 24, n, act);
    }
}

#define TIN16(MR) \
    X512B static void tin16_##MR(const uint32_t *xb, int64_t k, const uint16_t *w, const float *b, float *y, \
                                 int64_t n, int64_t col0, int act) { tile_in16(xb, k, w, MR, b, y, n, col0, act); }
TIN16(1) TIN16(2) TIN16(3) TIN16(4) TIN16(5) TIN16(6) TIN16(7) TIN16(8) TIN16(9) TIN16(10) TIN16(11) TIN16(12)
typedef void (*tin16_fn)(const uint32_t *, int64_t, const uint16_t *, const float *, float *, int64_t, int64_t, int);
static const tin16_fn TILES_IN16[MR_MAX + 1] = {NULL, tin16_1, tin16_2, tin16_3, tin16_4, tin16_5, tin16_6,
    tin16_7, tin16_8, tin16_9, tin16_10, tin16_11, tin16_12};

/* x [mc, k] → xb: tile by tile (sizes), each tile's rows input-pair-major ([kh][mr]), every input rounded to
   bfloat16, pair (2i, 2i + 1) in one 32-bit word (input 2i in the low half; zero past k). */
X512B static void pack_pairs(const float *x, int64_t mc, int64_t k, const int64_t *sizes, int64_t tiles,
                             uint32_t *xb) {
    (void)mc;
    int64_t kh = (k + 1) / 2;
    for (int64_t t = 0, r0 = 0; t < tiles; r0 += sizes[t], t++)
        for (int64_t r = 0; r < sizes[t]; r++) {
            const float *xr = x + (r0 + r) * k;
            uint32_t *dst = xb + r0 * kh + r;
            for (int64_t i = 0; i < kh; i++) {
                uint32_t lo = to_bf16(xr[2 * i]), hi = 2 * i + 1 < k ? to_bf16(xr[2 * i + 1]) : 0;
                dst[i * sizes[t]] = lo | hi << 16;
            }
        }
}
#endif

/* ----------------------------------------------------------------- bfloat16 inputs on AMX-BF16 tiles
   Where the CPU has AMX-BF16, inputs=bfloat16 runs on tiles for every number of rows, one too: the tiles
   sum in their own order (Intel leaves TDPBF16PS's rounding of its adds to the implementation), so a row
   gets the same bits alone or batched only if it always takes them. A TDPBF16PS multiplies 16 rows by 32
   inputs (tile A: bfloat16 rows, kp apart) into 16 outputs (tile B: the inputs in pairs,
   [16 pairs][16 outputs][2]); each output's float32 sum runs over all of k in the tiles and is stored once,
   then the bias and GELU (gelu16: gelu8's bits, as the other paths end). FMT_BF16P's panels
   ([kpad / 2][32][2]) are tile B's layout as they lie: a panel is two B tiles a step of 32 inputs, and
   every tile of rows takes a panel before the next. */
#if HAVE_AMX
/* Whether inputs=bfloat16 runs on AMX-BF16 tiles here: "" if so, else why not. */
static const char *amx_in16_check(void) {
    if (simd_path() != PATH_AVX512) return "a lesser path than AVX-512 runs";
    return amx_bf16_check();
}

/* Rows x [m, k] → xb [mp][kp] bfloat16 (nearest even), zeros past k and in the rows from m up to mp. */
X512 static void rows_to_bf16(const float *x, int64_t m, int64_t k, int64_t mp, int64_t kp, uint16_t *xb) {
    for (int64_t r = 0; r < mp; r++) {
        uint16_t *dst = xb + r * kp;
        for (int64_t i = 0; i < kp; i += 16) {
            int64_t left = r < m ? min64(16, k - i) : 0;
            __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __m512 v = _mm512_maskz_loadu_ps(keep, x + r * k + i);
            _mm256_storeu_si256((__m256i *)(dst + i), to_bf16x16(v));
        }
    }
}

/* Sums tile T (16 rows x 16 outputs at col) stored to s; rows below `rows` finished into y (+ bias, GELU
   with act), outputs below n. */
#define AMX_IN16_OUT(T, s, rows, y, n, col, b, act) do { \
    AMX_STORE_F(T, s); \
    if ((col) < (n)) { \
        __mmask16 keep = (n) - (col) >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ((n) - (col))) - 1); \
        __m512 bias = (b) ? _mm512_maskz_loadu_ps(keep, (b) + (col)) : _mm512_setzero_ps(); \
        for (int r = 0; r < (rows); r++) { \
            __m512 v = _mm512_load_ps((s) + 16 * r); \
            if (b) v = _mm512_add_ps(v, bias); \
            if (act) v = gelu16(v); \
            _mm512_mask_storeu_ps((y) + r * (n) + (col), keep, v); \
        } \
    } } while (0)

/* One paired panel wp (outputs col .. col + 31) times all rows of xb [mp][kp] (mp a multiple of 16; the
   first m real), 32 rows a step: A tiles 0, 1, B tiles 2, 3, sums 4 to 7. */
XAMXB static void in16_panel_amx(const uint16_t *xb, int64_t m, int64_t mp, int64_t kp, const uint16_t *wp,
                                 const float *b, float *y, int64_t n, int64_t col, int act) {
    float s[256] __attribute__((aligned(64)));
    for (int64_t r0 = 0; r0 < mp; r0 += 32) {
        const uint16_t *xa = xb + r0 * kp, *xc = xa + 16 * kp;
        _tile_zero(4); _tile_zero(5);
        if (r0 + 16 < mp) {
            _tile_zero(6); _tile_zero(7);
            for (int64_t i = 0; i < kp; i += 32) {
                _tile_loadd(2, wp + i * PANEL, 4 * PANEL);
                _tile_loadd(3, wp + i * PANEL + PANEL, 4 * PANEL);
                _tile_loadd(0, xa + i, kp * 2);
                _tile_loadd(1, xc + i, kp * 2);
                _tile_dpbf16ps(4, 0, 2);
                _tile_dpbf16ps(5, 0, 3);
                _tile_dpbf16ps(6, 1, 2);
                _tile_dpbf16ps(7, 1, 3);
            }
        } else {
            for (int64_t i = 0; i < kp; i += 32) {
                _tile_loadd(2, wp + i * PANEL, 4 * PANEL);
                _tile_loadd(3, wp + i * PANEL + PANEL, 4 * PANEL);
                _tile_loadd(0, xa + i, kp * 2);
                _tile_dpbf16ps(4, 0, 2);
                _tile_dpbf16ps(5, 0, 3);
            }
        }
        int64_t ra = min64(16, m - r0), rb = min64(16, m - r0 - 16);
        AMX_IN16_OUT(4, s, ra, y + r0 * n, n, col, b, act);
        AMX_IN16_OUT(5, s, ra, y + r0 * n, n, col + 16, b, act);
        if (rb > 0) {
            AMX_IN16_OUT(6, s, rb, y + (r0 + 16) * n, n, col, b, act);
            AMX_IN16_OUT(7, s, rb, y + (r0 + 16) * n, n, col + 16, b, act);
        }
    }
}

/* product_in16 on AMX-BF16: every row rounded to bfloat16 once, then the panels split among the threads in
   tasks of TASK, each panel taken by all the rows. Returns 0 or -1 (out of memory). */
XAMXB static int product_in16_amx(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                                  const float *b, float *y, int threads, int act) {
    int64_t count = (n + PANEL - 1) / PANEL, tasks = (count + TASK - 1) / TASK;
    int64_t kp = kpad(k), mp = (m + 15) / 16 * 16, workers = threads > 1 ? threads : 1;
    if (m < 1) return 0;
    uint16_t *xb = aligned_alloc(64, (size_t)(mp * kp * 2));
    if (!xb) return -1;
    rows_to_bf16(x, m, k, mp, kp, xb);
    /* Fewer than 16 rows: the tiles of rows (A 0, 1; sums 4 to 7) hold only those, so that a decode step's
       tiles load and multiply no padding (each output's sum is the same chain) */
    struct amx_config config __attribute__((aligned(64))) = AMX_FULL_CONFIG;
    if (m < 16)
        for (int t = 0; t < 8; t++)
            if (t != 2 && t != 3) config.rows[t] = (uint8_t)m;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads((int)workers) if (workers > 1 && tasks > 1)
#endif
    for (int64_t t = 0; t < tasks; t++) {
        _tile_loadconfig(&config);
        for (int64_t p = t * TASK; p < min64(count, (t + 1) * TASK); p++)
            in16_panel_amx(xb, m, mp, kp, w + p * kp * PANEL, b, y, n, p * PANEL, act);
        _tile_release();
    }
    free(xb);
    return 0;
}
#endif

/* Which path inputs=bfloat16's products take here: BF16_AMX, BF16_AVX512 (VDPBF16PS) or 0 (float32
   inputs); *why says why not AMX-BF16 ("" when it runs), or why neither. */
static int in16_path(const char **why) {
#if HAVE_AMX
    *why = amx_in16_check();
    if (!(*why)[0]) return BF16_AMX;
#else
    *why = "the compiler that built the kernels lacks AMX";
#endif
    const char *vdp = bf16_products_check();
    if (!vdp[0]) return BF16_AVX512;
    *why = vdp;
    return 0;
}

/* product() of a bfloat16 weight with inputs=bfloat16 (see above): on AMX-BF16 tiles where the CPU has them,
   else MC rows at a time, tiles of up to MR_MAX rows, the panels split among the threads (my_share).
   Returns 0, -1 out of memory, or 1 when this CPU has neither path (nothing computed). */
static int product_in16(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n, const float *b,
                        float *y, int threads, int act) {
    const char *why;
    int path = in16_path(&why);
#if HAVE_AMX
    if (path == BF16_AMX) return product_in16_amx(x, m, k, w, n, b, y, threads, act);
#endif
    if (path == 0) return 1;
#if HAVE_BF16
    int64_t count = (n + PANEL - 1) / PANEL, tasks = (count + TASK - 1) / TASK, kh = (k + 1) / 2;
    int64_t gs = panel_elems(k, FMT_BF16P);
    uint32_t *xb = malloc(sizeof(uint32_t) * (size_t)(min64(m, MC) * kh));
    if (!xb) return -1;
    (void)threads;
    for (int64_t m0 = 0; m0 < m; m0 += MC) {
        int64_t mc = min64(MC, m - m0), sizes[MC], tiles = (mc + MR_MAX - 1) / MR_MAX;
        for (int64_t t = 0; t < tiles; t++) sizes[t] = mc / tiles + (t < mc % tiles);
        pack_pairs(x + m0 * k, mc, k, sizes, tiles, xb);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1 && tasks > 1)
#endif
        {
            int64_t p, end;
            for (my_share(count, &p, &end); p < end; p++)
                for (int64_t t = 0, r0 = 0; t < tiles; r0 += sizes[t], t++)
                    TILES_IN16[sizes[t]](xb + r0 * kh, k, w + p * gs, b, y + (m0 + r0) * n, n, p * PANEL, act);
        }
    }
    free(xb);
    return 0;
#else
    (void)x; (void)m; (void)k; (void)w; (void)n; (void)b; (void)y; (void)threads; (void)act;
    return 1;
#endif
}

/* product() of FMT_BF16P weights where neither bfloat16 path runs (a lesser path forced after they were
   paired): float32 inputs, as FMT_BF16 would compute, on a copy of the weights unpaired. Returns 0 or -1
   (out of memory). */
static int product_unpaired(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t n, const float *b,
                            float *y, int threads, int act) {
    int64_t count = (n + PANEL - 1) / PANEL;
    uint16_t *plain = malloc(sizeof(uint16_t) * (size_t)(count * k * PANEL));
    if (!plain) return -1;
    for (int64_t p = 0; p < count; p++)
        for (int64_t i = 0; i < k; i++)
            for (int j = 0; j < PANEL; j++)
                plain[elem_at(p, i, j, k, FMT_BF16)] = w[elem_at(p, i, j, k, FMT_BF16P)];
    int rc = product(x, m, k, plain, n, b, y, FMT_BF16, threads, act);
    free(plain);
    return rc;
}

/* attend_blocked's attention in bfloat16, in tiles of 16 queries, on the best bfloat16 path. Returns 0,
   or -1 when it cannot run (no bfloat16 path, d not a multiple of 32, out of memory): then nothing is
   computed. */
#if HAVE_BF16
X512B static int attend_bf16(int64_t b, int64_t h, int64_t hkv, int64_t t, int64_t d, const float *q, int64_t q_s,
                             int64_t q_h, int64_t q_t, const float *k, const float *v, int64_t l, int64_t offset,
                             float *out, int64_t o_s, int64_t o_h, int64_t o_t, int threads) {
    const char *why;
    int bf16 = bf16_attention_path(&why);
    if (d % 32 || !bf16) return -1;
    int64_t keys = offset + t, lk = (keys + 31) / 32 * 32, tiles = (t + 15) / 16, group = h / hkv;
    uint16_t *kt = calloc((size_t)(b * hkv * d * lk), 2), *vt = calloc((size_t)(b * hkv * d * lk), 2);
    if (!kt || !vt) { free(kt); free(vt); return -1; }
    float scale = 1.0f / sqrtf((float)d);
    int failed = 0;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1)
#endif
    {
        float *scratch = malloc(sizeof(float) * (size_t)(16 * lk + 1024 + 8 * lk + 8 * d)
                                + sizeof(uint16_t) * (size_t)(16 * lk + 16 * d));
        if (!scratch) failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t bh = 0; bh < b * hkv; bh++) {
            const float *kh = k + bh * l * d, *vh = v + bh * l * d;
            uint32_t *kd = (uint32_t *)(kt + bh * d * lk), *vd = (uint32_t *)(vt + bh * d * lk);
            /* a key's d values are d / 2 pairs, pair i to row i of kd (lk pairs a row): 16 keys at a time
               through the scratch, so that each row gets 64 bytes at once (rows lk * 4 bytes apart share
               cache sets: a key at a time, or AMD's slow scatter, measured slower; docs/benchmarks-half.md) */
            uint32_t *rows = (uint32_t *)(scratch + 16 * lk + 1024);  /* [16][d / 2], in pt's place */
            for (int64_t j0 = 0; scratch && j0 < keys; j0 += 16) {
                int64_t m = min64(16, keys - j0);
                for (int64_t j = 0; j < m; j++)
                    for (int64_t c = 0; c < d; c += 16)
                        _mm256_storeu_si256((__m256i *)((uint16_t *)(rows + j * (d / 2)) + c),
                                            to_bf16x16(_mm512_loadu_ps(kh + (j0 + j) * d + c)));
                for (int64_t c = 0; c < d / 2; c++)
                    for (int64_t j = 0; j < m; j++) kd[c * lk + j0 + j] = rows[j * (d / 2) + c];
            }
            /* keys j, j + 1 side by side in each 32-bit lane, d of them a row */
            for (int64_t j = 0; j < keys; j += 2)
                for (int64_t c = 0; c < d; c += 16) {
                    __m512i lo = bf16_lanes(_mm512_loadu_ps(vh + j * d + c));
                    __m512i hi = j + 1 < keys ? bf16_lanes(_mm512_loadu_ps(vh + (j + 1) * d + c)) : _mm512_setzero_si512();
                    _mm512_storeu_si512((void *)(vd + (j / 2) * d + c), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
                }
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t item = 0; item < b * h * tiles; item++) {
            if (!scratch) continue;
            int64_t bh = item / tiles, tile = tiles - 1 - item % tiles, seq = bh / h, head = bh % h;
            int64_t kv = seq * hkv + head / group;
            int64_t i0 = tile * 16;
            int mr = (int)min64(16, t - i0);
            float *s = scratch, *ob = scratch + 16 * lk;
            uint32_t *pt = (uint32_t *)(ob + 1024), *qp = pt + 8 * lk;
            uint16_t *pb = (uint16_t *)(qp + 8 * d), *qb = pb + 16 * lk;
            for (int r = 0; r < 16; r++)
                for (int64_t c = 0; c < d; c += 16)
                    _mm256_storeu_si256((__m256i *)(qb + r * d + c),
                                        r < mr ? to_bf16x16(_mm512_loadu_ps(q + seq * q_s + head * q_h + (i0 + r) * q_t + c))
                                               : _mm256_setzero_si256());
            float *o = out + seq * o_s + head * o_h + i0 * o_t;
#if HAVE_AMX
            if (bf16 == BF16_AMX) {
                attend_tile_amx(qb, kt + kv * d * lk, vt + kv * d * lk, lk, d, offset + i0 + 1, mr, scale, s, pb, ob,
                                o, o_t);
                continue;
            }
#endif
            for (int64_t c = 0; c < d / 2; c++)  /* the queries' pairs, pair-major */
                for (int r = 0; r < 16; r++) qp[c * 16 + r] = ((const uint32_t *)qb)[r * (d / 2) + c];
            attend_tile_dpbf16(qp, kt + kv * d * lk, vt + kv * d * lk, lk, d, offset + i0 + 1, mr, scale, s, pb, pt,
                               o, o_t);
        }
        free(scratch);
    }
    free(kt); free(vt);
    return failed ? -1 : 0;
}
#endif

/* Prompts of more queries than this attend in tiles (attend_blocked) on the AVX-512 and AVX2 paths. */
#define BLOCKED_QUERIES 64

/* What a cache write returns when a finite key or value is beyond float16's range (kv=float16). */
#define KV_OUT_OF_RANGE -2

/* n values rounded to float16 into o (see f32_to_f16), portable C. Returns 1 if a finite value was beyond
   float16's range (it became inf), else 0. */
static int store_f16_portable(uint16_t *o, const float *x, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        o[i] = f32_to_f16(x[i]);
        bad |= fabsf(x[i]) >= 65520.0f && fabsf(x[i]) < INFINITY;
    }
    return bad;
}

static void widen_f16_portable(const uint16_t *h, int64_t n, float *o) {
    for (int64_t i = 0; i < n; i++) o[i] = f16_to_f32(h[i]);
}

#if HAVE_X86
/* store_f16_portable 8 at a time (VCVTPS2PH rounds the same), the rest through it. */
X86 static int store_f16_x86(uint16_t *o, const float *x, int64_t n) {
    __m256 lim = _mm256_set1_ps(65520.0f), inf = _mm256_set1_ps(INFINITY);
    __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int bad = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), a = _mm256_and_ps(v, magnitude);
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        bad |= _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(a, lim, _CMP_GE_OQ), _mm256_cmp_ps(a, inf, _CMP_LT_OQ)));
    }
    return (bad != 0) | store_f16_portable(o + i, x + i, n - i);
}

X86 static void widen_f16_x86(const uint16_t *h, int64_t n, float *o) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    widen_f16_portable(h + i, n - i, o + i);
}
#endif

/* n values into a cache row at dst: copied (float32), or rounded to float16 (h16; nearest even, as
   NumPy's astype). Returns 0, or 1 if a finite value was beyond float16's range (it became inf). */
static int store_kv(void *dst, const float *x, int64_t n, int h16) {
    if (!h16) {
        memcpy(dst, x, sizeof(float) * (size_t)n);
        return 0;
    }
#if HAVE_X86
    if (simd_path()) return store_f16_x86(dst, x, n);
#endif
    return store_f16_portable(dst, x, n);
}

/* The first `keys` rows of `heads` key and value heads of float16 caches [heads, l, d], widened into one
   float32 buffer: the keys [heads, keys, d], then the values. The tiled prompt paths read float32 (a
   prompt's attention does t times more work than this pass). NULL out of memory. */
static float *widen_kv(const void *k, const void *v, int64_t heads, int64_t l, int64_t keys, int64_t d) {
    float *w = malloc(sizeof(float) * (size_t)(2 * heads * keys * d));
    for (int64_t i = 0; w && i < 2 * heads; i++) {
        const uint16_t *src = (const uint16_t *)(i < heads ? k : v) + (i % heads) * l * d;
        float *dst = w + i * keys * d;
#if HAVE_X86
        if (simd_path()) { widen_f16_x86(src, keys * d, dst); continue; }
#endif
        widen_f16_portable(src, keys * d, dst);
    }
    return w;
}

/* Causal attention, as attend_all's arguments, on the fastest path: a prompt of more than
   BLOCKED_QUERIES queries in tiles on AVX-512 (with att16 in bfloat16, where the CPU can: attend_bf16) or
   AVX2 (d a multiple of 8), else a query at a time (attend_all). The tiled paths read float16 caches
   widened. */
static void attend_any(int64_t b, int64_t h, int64_t hkv, int64_t t, int64_t d, const float *q, int64_t q_s,
                       int64_t q_h, int64_t q_t, const void *k, const void *v, int64_t l, int64_t offset,
                       float *out, int64_t o_s, int64_t o_h, int64_t o_t, int threads, int att16, int h16) {
    int simd = simd_path(), wide512 = simd == PATH_AVX512 && (d % 16 == 0 || att16);
    int tiled = t > BLOCKED_QUERIES && (wide512 || (simd == PATH_AVX2 && d % 8 == 0)), done = 0;
    const float *kf = k, *vf = v;
    int64_t lf = l;
    float *wide = NULL;
    if (tiled && h16) {
        wide = widen_kv(k, v, b * hkv, l, offset + t, d);
        tiled = wide != NULL;
        kf = wide;
        vf = wide ? wide + b * hkv * (offset + t) * d : NULL;
        lf = offset + t;
    }
#if HAVE_BF16
    done = att16 && tiled && simd == PATH_AVX512  /* (its code is AVX-512's: never called on AVX2) */
           && !attend_bf16(b, h, hkv, t, d, q, q_s, q_h, q_t, kf, vf, lf, offset, out, o_s, o_h, o_t, threads);
#else
    (void)att16;
#endif
    if (!done && tiled && d % (simd == PATH_AVX512 ? 16 : 8) == 0)
        done = !attend_blocked(simd, b, h, hkv, t, d, q, q_s, q_h, q_t, kf, vf, lf, offset, out, o_s, o_h, o_t,
                               threads);
    if (!done) attend_all(b, h, hkv, t, d, q, q_s, q_h, q_t, k, v, l, offset, out, o_s, o_h, o_t, threads, h16);
    free(wide);
}

/* The attention of a decode step from the fused projection: qkv [b, t, 3, h, d] (the c_attn product of b
   sequences of t new tokens, bias added) → the keys and values written into the caches k, v [b, h, l, d]
   (float32, or float16: h16) at positions offset .. offset + t - 1, and the attention of the queries into
   out [b, t, h, d] (the layout c_proj takes). One call instead of NumPy's head split, two cache writes, a
   query copy and the head merge. Returns 0, or KV_OUT_OF_RANGE (nothing attended). */
static int qkv_attention(const float *qkv, int64_t b, int64_t t, int64_t h, int64_t d, void *k, void *v,
                         int64_t l, int64_t offset, float *out, int threads, int att16, int h16) {
    int64_t c = h * d, es = h16 ? 2 : 4;
    int bad = 0;
    for (int64_t seq = 0; seq < b; seq++)
        for (int64_t i = 0; i < t; i++)
            for (int64_t head = 0; head < h; head++) {
                const float *row = qkv + (seq * t + i) * 3 * c + head * d;
                int64_t at = ((seq * h + head) * l + offset + i) * d * es;
                bad |= store_kv((char *)k + at, row + c, d, h16);
                bad |= store_kv((char *)v + at, row + 2 * c, d, h16);
            }
    if (bad) return KV_OUT_OF_RANGE;
    attend_any(b, h, h, t, d, qkv, t * 3 * c, d, 3 * c, k, v, l, offset, out, t * c, d, c, threads, att16, h16);
    return 0;
}

/* Where part `part` of `parts` of a ragged step's (token, head) items starts, so that each part holds about
   as many keys to read: cum[tok] is the keys of the items before token tok (cum[0] = 0, n + 1 entries), a
   token's h items reading equally many. */
static int64_t items_split(const int64_t *cum, int64_t n, int64_t h, int64_t part, int64_t parts) {
    if (part >= parts) return n * h;
    int64_t want = cum[n] * part / parts, lo = 0, hi = n;
    while (lo < hi) {  /* the last token that starts at or before `want` */
        int64_t mid = (lo + hi + 1) / 2;
        if (cum[mid] <= want) lo = mid;
        else hi = mid - 1;
    }
    if (lo >= n) return n * h;
    int64_t per = (cum[lo + 1] - cum[lo]) / h, head = (want - cum[lo] + per - 1) / per;
    return lo * h + min64(head, h);
}

/* The heads of a ragged step's tokens: head j of token tok at base + tok * tok_s + j * head_s (in floats),
   d contiguous values; GPT-2's fused projection [n, 3, h, d] and the Llama family's [h, n, d] alike. */
typedef struct { const float *base; int64_t tok_s, head_s; } TokHeads;

static const float *tok_head(TokHeads x, int64_t tok, int64_t j) { return x.base + tok * x.tok_s + j * x.head_s; }

/* The attention of a ragged step: the queries q of h heads and the new keys kn and values vn of hkv heads
   (h a multiple of hkv: query head j reads key/value head j / (h / hkv)) of n tokens, R rows one after
   another (row r: `len[r]` tokens from `start[r]`, at positions off[r] .. of its own caches k[r], v[r],
   each [hkv, l[r], d]). Writes every row's new keys and values into its caches, then attends all
   (token, query head) pairs in one parallel loop, into out [n, h, d]. The caches hold float32, or float16
   (h16). Returns 0, -1 out of memory, or KV_OUT_OF_RANGE (nothing attended). */
static int ragged_attention(TokHeads q, TokHeads kn, TokHeads vn, int64_t n, int64_t h, int64_t hkv, int64_t d,
                            int64_t rows, const int64_t *start, const int64_t *len, const int64_t *off,
                            void *const *k, void *const *v, const int64_t *l, float *out, int threads, int h16) {
    int64_t es = h16 ? 2 : 4, group = h / hkv;
    int bad = 0;
    /* row_of[tok]: the token's row; cum: the keys of the items before each token (items_split) */
    int64_t *row_of = malloc(sizeof(int64_t) * (size_t)(2 * n + 1)), *cum = row_of + n;
    if (!row_of) return -1;
    int64_t most = 0;
    cum[0] = 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < len[r]; i++) {
            int64_t tok = start[r] + i;
            row_of[tok] = r;
            cum[tok + 1] = cum[tok] + h * (off[r] + i + 1);
            for (int64_t j = 0; j < hkv; j++) {
                int64_t at = (j * l[r] + off[r] + i) * d * es;
                bad |= store_kv((char *)k[r] + at, tok_head(kn, tok, j), d, h16);
                bad |= store_kv((char *)v[r] + at, tok_head(vn, tok, j), d, h16);
            }
        }
        if (off[r] + len[r] > most) most = off[r] + len[r];
    }
    if (bad) { free(row_of); return KV_OUT_OF_RANGE; }
    float scale = 1.0f / sqrtf((float)d);
    int simd = HAVE_X86 && d % 8 == 0 && simd_path();
    (void)threads; (void)simd;
    /* Each thread attends one run of items holding its share of the keys, so that the head it fetches ahead
       (prefetch_row) is the one it attends next. */
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1 && n * h * most >= 512)
#endif
    {
        int64_t part, parts;
        my_part(&part, &parts);
        int64_t first = items_split(cum, n, h, part, parts), end = items_split(cum, n, h, part + 1, parts);
        int64_t most = simd ? min64(group, group_most(simd_path(), d)) : 1;
        for (int64_t item = first, g; item < end; item += g) {
            int64_t tok = item / h, head = item % h, r = row_of[tok], kvh = head / group;
            int64_t keys = off[r] + (tok - start[r]) + 1;
            /* the query heads of the token's group that fall in this run, `most` at a time (attend_group) */
            g = min64(min64(most, end - item), group - head % group);
            const float *qi = tok_head(q, tok, head);
            const void *kh = (const char *)k[r] + kvh * l[r] * d * es, *vh = (const char *)v[r] + kvh * l[r] * d * es;
            float *o = out + (tok * h + head) * d;
#if HAVE_X86
            if (simd) {
                float buf[GROUP_MAX * STACK_KEYS];
                float *s = keys <= STACK_KEYS ? buf : malloc(sizeof(float) * (size_t)(g * keys));
                if (s) {
                    /* a decode row's next item's key/value head, when it is another one (see attend_simd) */
                    int64_t nt = (item + g) / h, nkv = (item + g) % h / group;
                    int64_t nr = item + g < end && len[r] == 1 ? row_of[nt] : -1;
                    if (nr == r && nkv == kvh) nr = -1;
                    const void *nk = nr >= 0 ? (const char *)k[nr] + nkv * l[nr] * d * es : NULL;
                    const void *nv = nr >= 0 ? (const char *)v[nr] + nkv * l[nr] * d * es : NULL;
                    attend_group(simd_path(), g, qi, q.head_s, kh, vh, keys, d, scale, s, keys, o, d, nk, nv, h16);
                    if (s != buf) free(s);
                    continue;
                }
            }
#endif
            for (int64_t i = 0; i < g; i++) attend_portable(qi + i * q.head_s, kh, vh, keys, d, scale, o + i * d, h16);
        }
    }
    free(row_of);
    return 0;
}

/* ---------------------------------------------- the Llama family's elementwise kernels, in C
   RMS norm, the rotary position embedding and the gated MLP's silu(gate) * up: at one token a step
   NumPy's passes over a few hundred values (each a call and a temporary) cost more than the work. Same
   paths as the products, by simd_path(): AVX-512, AVX2 + FMA, portable C. Every path computes the same
   float32 formula (the RMS norm's sum of squares in double, as the layer norm's), so they agree to a
   rounding or two. */

/* The rows of an array whose last axis (c values) is contiguous and whose other axes have any strides
   (in floats): nd leading axes, rows = the product of their sizes. */
typedef struct { const float *base; int nd; int64_t shape[8]; int64_t stride[8]; } RowView;

static const float *row_at(const RowView *v, int64_t r) {
    int64_t at = 0;
    for (int i = v->nd - 1; i >= 0; i--) {
        at += (r % v->shape[i]) * v->stride[i];
        r /= v->shape[i];
    }
    return v->base + at;
}

/* The sum of squares of x [c] in double, and the row times inv * gamma into o: one RMS-norm row. */
static void rms_row_portable(const float *x, int64_t c, const float *gamma, double eps, float *o) {
    double sq = 0.0;
    for (int64_t i = 0; i < c; i++) sq += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(sq / (double)c + eps));
    for (int64_t i = 0; i < c; i++) o[i] = x[i] * inv * gamma[i];
}

static void silu_mul_portable(const float *g, const float *u, int64_t n, float *o) {
    for (int64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* One rotary row: x [2 * half] at one position, its angles' cos and sin [half], into o. */
static void rotary_row_portable(const float *x, int64_t half, const float *cs, const float *sn, float *o) {
    for (int64_t j = 0; j < half; j++) {
        float x1 = x[j], x2 = x[half + j];
        o[j] = x1 * cs[j] - x2 * sn[j];
        o[half + j] = x2 * cs[j] + x1 * sn[j];
    }
}

#if HAVE_X86
X86 static void rms_row_avx2(const float *x, int64_t c, const float *gamma, double eps, float *o) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= c; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    double part[4], sq = 0.0;
    _mm256_storeu_pd(part, _mm256_add_pd(s0, s1));
    sq = part[0] + part[1] + part[2] + part[3];
    for (int64_t j = i; j < c; j++) sq += (double)x[j] * x[j];
    float inv = (float)(1.0 / sqrt(sq / (double)c + eps));
    __m256 vi = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= c; i += 8)
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), _mm256_loadu_ps(gamma + i)));
    for (; i < c; i++) o[i] = x[i] * inv * gamma[i];
}

/* g / (1 + e^-g) * u, 8 at a time (exp8 clamps its argument: a large |g| saturates, no inf or NaN). */
X86 static void silu_mul_avx2(const float *g, const float *u, int64_t n, float *o) {
    int64_t i = 0;
    __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gv))));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    silu_mul_portable(g + i, u + i, n - i, o + i);
}

X86 static void rotary_row_avx2(const float *x, int64_t half, const float *cs, const float *sn, float *o) {
    int64_t j = 0;
    for (; j + 8 <= half; j += 8) {
        __m256 x1 = _mm256_loadu_ps(x + j), x2 = _mm256_loadu_ps(x + half + j);
        __m256 c = _mm256_loadu_ps(cs + j), s = _mm256_loadu_ps(sn + j);
        _mm256_storeu_ps(o + j, _mm256_sub_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x2, s)));
        _mm256_storeu_ps(o + half + j, _mm256_add_ps(_mm256_mul_ps(x2, c), _mm256_mul_ps(x1, s)));
    }
    for (; j < half; j++) {
        float x1 = x[j], x2 = x[half + j];
        o[j] = x1 * cs[j] - x2 * sn[j];
        o[half + j] = x2 * cs[j] + x1 * sn[j];
    }
}

X512 static void rms_row_avx512(const float *x, int64_t c, const float *gamma, double eps, float *o) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= c; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double sq = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (int64_t j = i; j < c; j++) sq += (double)x[j] * x[j];
    float inv = (float)(1.0 / sqrt(sq / (double)c + eps));
    __m512 vi = _mm512_set1_ps(inv);
    for (i = 0; i + 16 <= c; i += 16)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi), _mm512_loadu_ps(gamma + i)));
    for (; i < c; i++) o[i] = x[i] * inv * gamma[i];
}

X512 static void silu_mul_avx512(const float *g, const float *u, int64_t n, float *o) {
    int64_t i = 0;
    __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, gv))));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    silu_mul_portable(g + i, u + i, n - i, o + i);
}

X512 static void rotary_row_avx512(const float *x, int64_t half, const float *cs, const float *sn, float *o) {
    int64_t j = 0;
    for (; j + 16 <= half; j += 16) {
        __m512 x1 = _mm512_loadu_ps(x + j), x2 = _mm512_loadu_ps(x + half + j);
        __m512 c = _mm512_loadu_ps(cs + j), s = _mm512_loadu_ps(sn + j);
        _mm512_storeu_ps(o + j, _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s)));
        _mm512_storeu_ps(o + half + j, _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s)));
    }
    for (; j < half; j++) {
        float x1 = x[j], x2 = x[half + j];
        o[j] = x1 * cs[j] - x2 * sn[j];
        o[half + j] = x2 * cs[j] + x1 * sn[j];
    }
}
#endif

/* RMS norm over the last axis (c values) of every row of x, into out [rows, c] (contiguous). */
static void rms_norm_rows(const RowView *x, int64_t rows, int64_t c, const float *gamma, double eps, float *out) {
    int simd = simd_path();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = row_at(x, r);
        float *o = out + r * c;
#if HAVE_X86
        if (simd == PATH_AVX512) { rms_row_avx512(xr, c, gamma, eps, o); continue; }
        if (simd == PATH_AVX2) { rms_row_avx2(xr, c, gamma, eps, o); continue; }
#endif
        (void)simd;
        rms_row_portable(xr, c, gamma, eps, o);
    }
}

/* silu(g) * u of n values (contiguous), into o. */
static void silu_mul_all(const float *g, const float *u, int64_t n, float *o) {
    int simd = simd_path();
#if HAVE_X86
    if (simd == PATH_AVX512) { silu_mul_avx512(g, u, n, o); return; }
    if (simd == PATH_AVX2) { silu_mul_avx2(g, u, n, o); return; }
#endif
    (void)simd;
    silu_mul_portable(g, u, n, o);
}

/* The rotary embedding of every row of x [..., t, 2 * half] (row r at position r % t of cos and sin
   [t, half]), into out (contiguous, x's shape). */
static void rotary_rows(const RowView *x, int64_t rows, int64_t t, int64_t half, const float *cs, const float *sn,
                        float *out) {
    int simd = simd_path();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = row_at(x, r), *c = cs + (r % t) * half, *s = sn + (r % t) * half;
        float *o = out + r * 2 * half;
#if HAVE_X86
        if (simd == PATH_AVX512) { rotary_row_avx512(xr, half, c, s, o); continue; }
        if (simd == PATH_AVX2) { rotary_row_avx2(xr, half, c, s, o); continue; }
#endif
        (void)simd;
        rotary_row_portable(xr, half, c, s, o);
    }
}

/* ------------------------------------------------------------ the Python functions (buffer protocol)
   Arrays come in through the buffer protocol, far cheaper an array than ctypes' .ctypes.data, which
   a decode step would pay ~250 times (docs/benchmarks.md). Each function checks what it is given (dtype, C order, shape) and, when
   an array is not what it takes, computes nothing and returns False: the caller then runs its NumPy path.
   It returns True when it has computed. The GIL is released while it computes. */

#define MAX_HELD 12

typedef struct { Py_buffer v[MAX_HELD]; int n; } Held;

static void release(Held *h) {
    for (int i = 0; i < h->n; i++) PyBuffer_Release(&h->v[i]);
    h->n = 0;
}

/* The buffer of `o` if it is a C-ordered array of `code` ('f': float32, 'H': uint16), native byte order,
   with `ndim` dimensions (any number, at least one, for ndim < 0); else NULL, with no error set. */
static Py_buffer *take(Held *h, PyObject *o, char code, int ndim, int writable) {
    if (h->n == MAX_HELD) return NULL;
    Py_buffer *v = &h->v[h->n];
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return NULL;
    }
    h->n++;
    const char *f = v->format ? v->format : "B";
    if (f[0] == '@' || f[0] == '=') f++;
    /* 'q': int64, which NumPy spells 'l' on LP64 platforms and 'q' elsewhere. */
    int ok = code == 'q' ? (f[0] == 'q' || f[0] == 'l') && v->itemsize == 8
                         : f[0] == code && v->itemsize == (code == 'f' ? 4 : code == 'b' ? 1 : 2);
    if (!ok || f[1] != '\0') return NULL;
    if (ndim >= 0 ? v->ndim != ndim : v->ndim < 1) return NULL;
    return v;
}

/* 16-bit weights of n outputs over k inputs in panels (see the top of the file): a uint16 array
   [ceil(n / PANEL), k, PANEL]. NULL if it is not that. */
static Py_buffer *take_weight(Held *h, PyObject *o, int64_t n, int64_t k, int64_t fmt) {
    fmt &= ~(int64_t)FMT_ROWS;  /* (a flag on the products, not the weights) */
    Py_buffer *v = take(h, o, BYTES(fmt) ? 'b' : 'H', 3, 0);
    if (!v || n < 1 || k < 1 || v->shape[0] != (n + PANEL - 1) / PANEL || v->shape[2] != PANEL
        || v->shape[1] != panel_elems(k, (int)fmt) / PANEL)
        return NULL;
    return v;
}

/* A float32 vector of n values, or None (*out NULL). 0 if it is neither. */
static int take_vector(Held *h, PyObject *o, int64_t n, const float **out) {
    *out = NULL;
    if (o == Py_None) return 1;
    Py_buffer *v = take(h, o, 'f', 1, 0);
    if (!v || v->shape[0] != n) return 0;
    *out = v->buf;
    return 1;
}

/* Whether two buffers have the same shape. */
static int same_shape(const Py_buffer *a, const Py_buffer *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* A weight format code this file knows. */
static int known_format(int64_t fmt) {
    return fmt == FMT_F16 || fmt == FMT_BF16 || fmt == FMT_I8 || fmt == FMT_Q4 || fmt == (FMT_I8 | FMT_ROWS)
           || fmt == FMT_BF16P;
}

static int as_int64(PyObject *o, int64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return 0;
    *out = (int64_t)v;
    return 1;
}

static int check_nargs(Py_ssize_t n, Py_ssize_t want, const char *name) {
    if (n == want) return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, n);
    return 0;
}

#define NOT_TAKEN do { release(&h); Py_RETURN_FALSE; } while (0)

/* matmul(x, w, n, b, y, fmt, threads, gelu): y [m, n] = x [m, k] @ the blocked w (n rows) .T + b (None:
   none), gelu_new after with gelu true. */
static PyObject *py_matmul(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t n, fmt, threads;
    if (!check_nargs(na, 8, "matmul") || !as_int64(a[2], &n) || !as_int64(a[5], &fmt) || !as_int64(a[6], &threads))
        return NULL;
    int act = PyObject_IsTrue(a[7]);
    if (act < 0) return NULL;
    const float *b;
    Py_buffer *x = take(&h, a[0], 'f', 2, 0);
    if (!x) NOT_TAKEN;
    int64_t m = x->shape[0], k = x->shape[1];
    Py_buffer *w = take_weight(&h, a[1], n, k, fmt);
    Py_buffer *y = take(&h, a[4], 'f', 2, 1);
    if (!w || !y || !known_format(fmt) || !take_vector(&h, a[3], n, &b) || y->shape[0] != m || y->shape[1] != n)
        NOT_TAKEN;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = product(x->buf, m, k, w->buf, n, b, y->buf, (int)fmt, (int)threads, act);
    Py_END_ALLOW_THREADS
    release(&h);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* unpack(w, n, j0, j1, k, out, fmt, threads): rows j0 .. j1 - 1 of the blocked w (n rows of k) as
   float32 into out [j1 - j0, k]: the unpacking for BLAS, and the embedding's gather one row at a time. */
static PyObject *py_unpack(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t n, j0, j1, k, fmt, threads;
    if (!check_nargs(na, 8, "unpack") || !as_int64(a[1], &n) || !as_int64(a[2], &j0) || !as_int64(a[3], &j1)
        || !as_int64(a[4], &k) || !as_int64(a[6], &fmt) || !as_int64(a[7], &threads))
        return NULL;
    fmt &= ~(int64_t)FMT_ROWS;  /* (a flag on the products, not the weights) */
    Py_buffer *w = take_weight(&h, a[0], n, k, fmt);
    Py_buffer *out = take(&h, a[5], 'f', 2, 1);
    if (!w || !out || !known_format(fmt) || j0 < 0 || j1 > n || j1 < j0 || out->shape[0] != j1 - j0
        || out->shape[1] != k)
        NOT_TAKEN;
    Py_BEGIN_ALLOW_THREADS
    (void)threads;
    unpack_rows(w->buf, k, j0, j1, out->buf, (int)fmt);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* unpack_t(w, n, p0, p1, k, out, fmt, threads): panels p0 .. p1 - 1 of w (n outputs over k inputs) as
   float32 into out [k, (p1 - p0) * PANEL], row-major: x @ out is the product of those outputs (BLAS's
   operand for products of many rows). */
static PyObject *py_unpack_t(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t n, p0, p1, k, fmt, threads;
    if (!check_nargs(na, 8, "unpack_t") || !as_int64(a[1], &n) || !as_int64(a[2], &p0) || !as_int64(a[3], &p1)
        || !as_int64(a[4], &k) || !as_int64(a[6], &fmt) || !as_int64(a[7], &threads))
        return NULL;
    fmt &= ~(int64_t)FMT_ROWS;  /* (a flag on the products, not the weights) */
    Py_buffer *w = take_weight(&h, a[0], n, k, fmt);
    Py_buffer *out = take(&h, a[5], 'f', 2, 1);
    if (!w || !out || !known_format(fmt) || p0 < 0 || p1 > w->shape[0] || p1 <= p0 || out->shape[0] != k
        || out->shape[1] != (p1 - p0) * PANEL)
        NOT_TAKEN;
    Py_BEGIN_ALLOW_THREADS
    unpack_t(w->buf, k, p0, p1, out->buf, (int)fmt, (int)threads);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* layernorm(x, gamma, beta, eps, out): over the last axis of x (any shape), into out (the same shape). */
static PyObject *py_layernorm(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t threads = 1;
    if (na != 6 && !check_nargs(na, 5, "layernorm")) return NULL;
    if (na == 6 && !as_int64(a[5], &threads)) return NULL;
    double eps = PyFloat_AsDouble(a[3]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    const float *gamma, *beta;
    Py_buffer *x = take(&h, a[0], 'f', -1, 0);
    if (!x) NOT_TAKEN;
    int64_t c = x->shape[x->ndim - 1], rows = c ? x->len / 4 / c : 0;
    Py_buffer *out = take(&h, a[4], 'f', -1, 1);
    if (!out || c < 1 || !same_shape(out, x) || !take_vector(&h, a[1], c, &gamma) || !take_vector(&h, a[2], c, &beta)
        || !gamma || !beta)
        NOT_TAKEN;
    Py_BEGIN_ALLOW_THREADS
    /* A prompt's rows split among the threads (each row computed as alone: the same bits). */
    int64_t parts = threads > 1 && rows >= 64 ? threads : 1;
    (void)parts;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads((int)parts) if (parts > 1)
#endif
    for (int64_t p = 0; p < parts; p++) {
        int64_t r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
        layernorm_rows((const float *)x->buf + r0 * c, r1 - r0, c, gamma, beta, eps, (float *)out->buf + r0 * c);
    }
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* A KV cache [b, h, l, d]: float32, or float16 (*h16 set; the option kv=float16). NULL if neither. */
static Py_buffer *take_cache(Held *h, PyObject *o, int writable, int *h16) {
    Py_buffer *v = take(h, o, 'f', 4, writable);
    *h16 = 0;
    if (v) return v;
    if (h->n > 0 && h->v[h->n - 1].obj == o) {  /* taken, but not float32: let it go, and try float16 */
        PyBuffer_Release(&h->v[--h->n]);
    }
    v = take(h, o, 'e', 4, writable);
    *h16 = v != NULL;
    return v;
}

/* The error a cache write raises when a key or value is beyond float16's range. */
static PyObject *kv_out_of_range(void) {
    PyErr_SetString(PyExc_ValueError, "kv=float16: a key or value is beyond float16's range (65504); "
                    "this model needs the float32 KV cache (kv=float32)");
    return NULL;
}

/* Whether k and v are KV caches [b, h, l, d] of one type with room for positions offset .. offset + t - 1. */
static int caches_fit(Py_buffer *k, Py_buffer *v, int64_t b, int64_t hd, int64_t d, int64_t offset, int64_t t) {
    if (!k || !v || offset < 0 || k->buf == v->buf || k->itemsize != v->itemsize) return 0;
    for (int i = 0; i < 4; i++)
        if (k->shape[i] != v->shape[i]) return 0;
    return k->shape[0] == b && k->shape[1] == hd && k->shape[3] == d && k->shape[2] >= offset + t;
}

/* attention(q, k, v, offset, out, threads): causal attention of the queries q [b, h, t, d] at positions
   offset .. offset + t - 1 over the caches k, v [b, hkv, l, d], into out [b, h, t, d]; h a multiple of
   hkv (grouped-query attention when hkv < h: query head j reads key/value head j / (h / hkv)). */
static PyObject *py_attention(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t offset, threads, att16 = 0;
    if (na != 7 && !check_nargs(na, 6, "attention")) return NULL;
    if (!as_int64(a[3], &offset) || !as_int64(a[5], &threads) || (na == 7 && !as_int64(a[6], &att16))) return NULL;
    Py_buffer *q = take(&h, a[0], 'f', 4, 0);
    if (!q) NOT_TAKEN;
    int64_t b = q->shape[0], hd = q->shape[1], t = q->shape[2], d = q->shape[3];
    int h16k, h16v;
    Py_buffer *k = take_cache(&h, a[1], 0, &h16k), *v = take_cache(&h, a[2], 0, &h16v);
    (void)h16v;  /* (caches_fit: both of one type) */
    Py_buffer *out = take(&h, a[4], 'f', 4, 1);
    int64_t hkv = k ? k->shape[1] : 0;
    if (hkv < 1 || hd % hkv || !caches_fit(k, v, b, hkv, d, offset, t) || !out || !same_shape(out, q) || d < 1
        || t < 1)
        NOT_TAKEN;
    int64_t l = k->shape[2];
    Py_BEGIN_ALLOW_THREADS
    attend_any(b, hd, hkv, t, d, q->buf, hd * t * d, t * d, d, k->buf, v->buf, l, offset, out->buf, hd * t * d,
               t * d, d, (int)threads, (int)att16, h16k);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* self_attention(x, w_attn, b_attn, w_proj, b_proj, k, v, offset, n_head, fmt, threads, out): a decode
   step's attention block in one call: qkv = x [b, t, c] @ w_attn (3c rows) + b_attn; its keys and values
   written into the caches k, v [b, n_head, l, c / n_head] at offset ..; the attention of its queries;
   then @ w_proj (c rows) + b_proj into out [b, t, c]. */
static PyObject *py_self_attention(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t offset, n_head, fmt, threads;
    if (!check_nargs(na, 12, "self_attention") || !as_int64(a[7], &offset) || !as_int64(a[8], &n_head)
        || !as_int64(a[9], &fmt) || !as_int64(a[10], &threads))
        return NULL;
    int att16 = (fmt & FMT_ATT16) != 0;
    fmt &= ~(int64_t)FMT_ATT16;
    const float *b_attn, *b_proj;
    Py_buffer *x = take(&h, a[0], 'f', 3, 0);
    if (!x || n_head < 1) NOT_TAKEN;
    int64_t b = x->shape[0], t = x->shape[1], c = x->shape[2], m = b * t, d = c / n_head;
    Py_buffer *wa = take_weight(&h, a[1], 3 * c, c, fmt), *wp = take_weight(&h, a[3], c, c, fmt);
    int h16, h16v;
    Py_buffer *k = take_cache(&h, a[5], 1, &h16), *v = take_cache(&h, a[6], 1, &h16v);
    (void)h16v;  /* (caches_fit: both of one type) */
    Py_buffer *out = take(&h, a[11], 'f', 3, 1);
    if (!wa || !wp || !out || !known_format(fmt) || c % n_head || !caches_fit(k, v, b, n_head, d, offset, t)
        || !same_shape(out, x)
        || !take_vector(&h, a[2], 3 * c, &b_attn) || !take_vector(&h, a[4], c, &b_proj))
        NOT_TAKEN;
    int64_t l = k->shape[2];
    float *qkv = malloc(sizeof(float) * (size_t)(m * 4 * c));  /* qkv [m, 3c], then y [m, c] */
    if (!qkv) { release(&h); return PyErr_NoMemory(); }
    float *y = qkv + m * 3 * c;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = product(x->buf, m, c, wa->buf, 3 * c, b_attn, qkv, (int)fmt, (int)threads, 0);
    if (!rc) rc = qkv_attention(qkv, b, t, n_head, d, k->buf, v->buf, l, offset, y, (int)threads, att16, h16);
    if (!rc) rc = product(y, m, c, wp->buf, c, b_proj, out->buf, (int)fmt, (int)threads, 0);
    Py_END_ALLOW_THREADS
    free(qkv);
    release(&h);
    if (rc == KV_OUT_OF_RANGE) return kv_out_of_range();
    if (rc) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* mlp(x, w_fc, f, b_fc, w_proj, b_proj, fmt, threads, out): out [m, c] = gelu_new(x [m, c] @ w_fc (f rows)
   + b_fc) @ w_proj (c rows) + b_proj: the MLP of a decode step in one call, the GELU inside the first
   product. */
static PyObject *py_mlp(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t f, fmt, threads;
    if (!check_nargs(na, 9, "mlp") || !as_int64(a[2], &f) || !as_int64(a[6], &fmt) || !as_int64(a[7], &threads))
        return NULL;
    const float *b_fc, *b_proj;
    Py_buffer *x = take(&h, a[0], 'f', 2, 0);
    if (!x) NOT_TAKEN;
    int64_t m = x->shape[0], c = x->shape[1];
    Py_buffer *wf = take_weight(&h, a[1], f, c, fmt), *wp = take_weight(&h, a[4], c, f, fmt);
    Py_buffer *out = take(&h, a[8], 'f', 2, 1);
    if (!wf || !wp || !out || !known_format(fmt) || !same_shape(out, x) || !take_vector(&h, a[3], f, &b_fc)
        || !take_vector(&h, a[5], c, &b_proj))
        NOT_TAKEN;
    float *hidden = malloc(sizeof(float) * (size_t)(m * f));
    if (!hidden) { release(&h); return PyErr_NoMemory(); }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = product(x->buf, m, c, wf->buf, f, b_fc, hidden, (int)fmt, (int)threads, 1);
    if (!rc) rc = product(hidden, m, f, wp->buf, c, b_proj, out->buf, (int)fmt, (int)threads, 0);
    Py_END_ALLOW_THREADS
    free(hidden);
    release(&h);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* gated_mlp(x, w_gate, w_up, f, w_down, fmt, threads, out): out [m, c] = (silu(x [m, c] @ w_gate) * (x @ w_up))
   @ w_down (w_gate and w_up f rows, w_down c rows; no biases): the Llama family's MLP in one call, as `mlp`
   is GPT-2's (the same products and silu_mul as the three calls it replaces, so the same bits). */
static PyObject *py_gated_mlp(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t f, fmt, threads;
    if (!check_nargs(na, 8, "gated_mlp") || !as_int64(a[3], &f) || !as_int64(a[5], &fmt) || !as_int64(a[6], &threads))
        return NULL;
    Py_buffer *x = take(&h, a[0], 'f', 2, 0);
    if (!x) NOT_TAKEN;
    int64_t m = x->shape[0], c = x->shape[1];
    Py_buffer *wg = take_weight(&h, a[1], f, c, fmt), *wu = take_weight(&h, a[2], f, c, fmt);
    Py_buffer *wd = take_weight(&h, a[4], c, f, fmt), *out = take(&h, a[7], 'f', 2, 1);
    if (!wg || !wu || !wd || !out || !known_format(fmt) || !same_shape(out, x) || m < 1) NOT_TAKEN;
    float *gate = malloc(sizeof(float) * (size_t)(2 * m * f)), *up = gate + m * f;
    if (!gate) { release(&h); return PyErr_NoMemory(); }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    const uint16_t *ws[2] = {wg->buf, wu->buf};
    int64_t ns[2] = {f, f};
    const float *bs[2] = {NULL, NULL};
    float *ys[2] = {gate, up};
    rc = products(x->buf, m, c, (Many){2, ws, ns, bs, ys}, (int)fmt, (int)threads);
    if (!rc) silu_mul_all(gate, up, m * f, gate);
    if (!rc) rc = product(gate, m, f, wd->buf, c, NULL, out->buf, (int)fmt, (int)threads, 0);
    Py_END_ALLOW_THREADS
    free(gate);
    release(&h);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* linears(x, ws, ns, bs, fmt, threads, outs): outs[j] [m, ns[j]] = x [m, c] @ ws[j] (ns[j] rows) + bs[j] (or
   None) for the 1 to 3 weights (one format) of tuples ws, ns, bs, outs: the projections that read one input
   in one call (q, k and v), its int8 or q4 panels in one parallel loop. */
static PyObject *py_linears(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t fmt, threads;
    if (!check_nargs(na, 7, "linears") || !as_int64(a[4], &fmt) || !as_int64(a[5], &threads)) return NULL;
    Py_ssize_t nw = PyTuple_Check(a[1]) ? PyTuple_GET_SIZE(a[1]) : 0;
    if (nw < 1 || nw > MAX_MANY || !PyTuple_Check(a[2]) || !PyTuple_Check(a[3]) || !PyTuple_Check(a[6])
        || PyTuple_GET_SIZE(a[2]) != nw || PyTuple_GET_SIZE(a[3]) != nw || PyTuple_GET_SIZE(a[6]) != nw)
        Py_RETURN_FALSE;
    Py_buffer *x = take(&h, a[0], 'f', 2, 0);
    if (!x || !known_format(fmt)) NOT_TAKEN;
    int64_t m = x->shape[0], c = x->shape[1], ns[MAX_MANY];
    const uint16_t *ws[MAX_MANY];
    const float *bs[MAX_MANY];
    float *ys[MAX_MANY];
    for (Py_ssize_t j = 0; j < nw; j++) {
        if (!as_int64(PyTuple_GET_ITEM(a[2], j), &ns[j])) { release(&h); return NULL; }
        Py_buffer *w = take_weight(&h, PyTuple_GET_ITEM(a[1], j), ns[j], c, fmt);
        Py_buffer *out = take(&h, PyTuple_GET_ITEM(a[6], j), 'f', 2, 1);
        if (!w || !out || out->shape[0] != m || out->shape[1] != ns[j] || !take_vector(&h, PyTuple_GET_ITEM(a[3], j), ns[j], &bs[j]))
            NOT_TAKEN;
        for (Py_ssize_t i = 0; i < j; i++)
            if (ys[i] == out->buf) NOT_TAKEN;  /* one array as two outputs */
        ws[j] = w->buf;
        ys[j] = out->buf;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = products(x->buf, m, c, (Many){(int)nw, ws, ns, bs, ys}, (int)fmt, (int)threads);
    Py_END_ALLOW_THREADS
    release(&h);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* The KV slots a ragged step's rows use, held from take_slots to release_slots: per row its start, length,
   offset and cache length (meta: four runs of R), its caches' buffers (ks[r], vs[r]), and whether they
   hold float16 (h16: all alike). */
typedef struct { int64_t rows, *meta; void **ks, **vs; Py_buffer *bufs; int held, h16; } Slots;

static void release_slots(Slots *s) {
    for (int i = 0; i < s->held; i++) PyBuffer_Release(&s->bufs[i]);
    free(s->meta); free(s->ks); free(s->vs); free(s->bufs);
    s->meta = NULL; s->ks = s->vs = NULL; s->bufs = NULL; s->held = 0;
}

/* rows int64 [R, 4] of (slot, offset, start, length), packed in order over n tokens (start = the lengths
   before it), each slot at most once; slot_kv a list of (k_cache, v_cache) per slot, each [1, hkv, P, d]
   of float32 or float16 (all alike) with room for its row. 1: taken (release_slots gives them back);
   0: not what it takes (nothing held); -1: out of memory (nothing held). */
static int take_slots(PyObject *slot_kv, Py_buffer *rb, int64_t n, int64_t hkv, int64_t d, Slots *s) {
    int64_t rows = rb->shape[0], slots = PyList_GET_SIZE(slot_kv);
    const int64_t *rv = rb->buf;
    *s = (Slots){.rows = rows, .h16 = -1};
    s->meta = malloc(sizeof(int64_t) * (size_t)(4 * rows));
    s->ks = malloc(sizeof(void *) * (size_t)rows);
    s->vs = malloc(sizeof(void *) * (size_t)rows);
    s->bufs = malloc(sizeof(Py_buffer) * (size_t)(2 * rows));
    char *used = calloc((size_t)(slots > 0 ? slots : 1), 1);
    if (!s->meta || !s->ks || !s->vs || !s->bufs || !used) { free(used); release_slots(s); return -1; }
    int taken = 1;
    for (int64_t r = 0, next = 0; taken && r < rows; r++) {
        int64_t slot = rv[4 * r], offset = rv[4 * r + 1], start = rv[4 * r + 2], length = rv[4 * r + 3];
        if (slot < 0 || slot >= slots || used[slot] || start != next || length < 1 || offset < 0) { taken = 0; break; }
        used[slot] = 1;
        next += length;
        if (r == rows - 1 && next != n) { taken = 0; break; }
        PyObject *pair = PyList_GET_ITEM(slot_kv, slot);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) { taken = 0; break; }
        for (int j = 0; j < 2 && taken; j++) {
            Py_buffer *v = &s->bufs[s->held];
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, j), v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
                PyErr_Clear();
                taken = 0;
                break;
            }
            s->held++;
            const char *f = v->format ? v->format : "B";
            if (f[0] == '@' || f[0] == '=') f++;
            int half = f[0] == 'e' && v->itemsize == 2;
            if (!(half || (f[0] == 'f' && v->itemsize == 4)) || f[1] != '\0' || v->ndim != 4 || v->shape[0] != 1
                || v->shape[1] != hkv || v->shape[3] != d || v->shape[2] < offset + length || (s->h16 >= 0 && half != s->h16))
                taken = 0;
            s->h16 = half;
            (j ? s->vs : s->ks)[r] = v->buf;
        }
        if (taken && (s->ks[r] == s->vs[r] || s->bufs[s->held - 1].shape[2] != s->bufs[s->held - 2].shape[2])) taken = 0;
        s->meta[r] = start; s->meta[rows + r] = length; s->meta[2 * rows + r] = offset;
        if (taken) s->meta[3 * rows + r] = s->bufs[s->held - 1].shape[2];
    }
    free(used);
    if (!taken) release_slots(s);
    return taken;
}

/* ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head, fmt, threads, out): the
   attention block of a ragged step in one call. x [1, n, c]; slot_kv a list of (k_cache, v_cache) per
   slot, each [1, n_head, P, c / n_head]; rows int64 [R, 4] of (slot, offset, start, length), packed in
   order (start = the lengths before it), each slot at most once, each row's positions within its caches.
   qkv = x @ w_attn + b_attn; each row's keys and values written into its slot; the attention of every
   row's queries over its own slot; then @ w_proj + b_proj into out [1, n, c]. */
static PyObject *py_ragged_self_attention(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t n_head, fmt, threads;
    if (!check_nargs(na, 11, "ragged_self_attention") || !as_int64(a[7], &n_head) || !as_int64(a[8], &fmt)
        || !as_int64(a[9], &threads))
        return NULL;
    const float *b_attn, *b_proj;
    Py_buffer *x = take(&h, a[0], 'f', 3, 0);
    if (!x || n_head < 1 || x->shape[0] != 1 || !PyList_Check(a[5])) NOT_TAKEN;
    int64_t n = x->shape[1], c = x->shape[2], d = c / n_head;
    Py_buffer *wa = take_weight(&h, a[1], 3 * c, c, fmt), *wp = take_weight(&h, a[3], c, c, fmt);
    Py_buffer *rb = take(&h, a[6], 'q', 2, 0), *out = take(&h, a[10], 'f', 3, 1);
    if (!wa || !wp || !rb || !out || !known_format(fmt) || c % n_head || d < 1 || !same_shape(out, x)
        || rb->shape[1] != 4 || rb->shape[0] < 1 || !take_vector(&h, a[2], 3 * c, &b_attn)
        || !take_vector(&h, a[4], c, &b_proj))
        NOT_TAKEN;
    Slots s;
    int taken = take_slots(a[5], rb, n, n_head, d, &s), rc = 0;
    float *qkv = taken > 0 ? malloc(sizeof(float) * (size_t)(n * 4 * c)) : NULL;  /* qkv [n, 3c], then y [n, c] */
    if (taken > 0 && qkv) {
        float *y = qkv + n * 3 * c;
        int64_t *m = s.meta, rows = s.rows;
        TokHeads q = {qkv, 3 * c, d}, kn = {qkv + c, 3 * c, d}, vn = {qkv + 2 * c, 3 * c, d};
        Py_BEGIN_ALLOW_THREADS
        rc = product(x->buf, n, c, wa->buf, 3 * c, b_attn, qkv, (int)fmt, (int)threads, 0);
        if (!rc) rc = ragged_attention(q, kn, vn, n, n_head, n_head, d, rows, m, m + rows, m + 2 * rows, s.ks, s.vs,
                                       m + 3 * rows, y, (int)threads, s.h16);
        if (!rc) rc = product(y, n, c, wp->buf, c, b_proj, out->buf, (int)fmt, (int)threads, 0);
        Py_END_ALLOW_THREADS
    } else if (taken > 0) {
        rc = -1;
    }
    if (taken > 0) release_slots(&s);
    free(qkv);
    release(&h);
    if (rc == KV_OUT_OF_RANGE) return kv_out_of_range();
    if (taken < 0 || rc) return PyErr_NoMemory();
    if (!taken) Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* The buffer of `o` if it is float32 (native byte order) of 1 to 9 dimensions, the last one contiguous and
   the others any whole-float strides (a NumPy view such as a transpose of heads); else NULL. */
static Py_buffer *take_strided(Held *h, PyObject *o) {
    if (h->n == MAX_HELD) return NULL;
    Py_buffer *v = &h->v[h->n];
    if (PyObject_GetBuffer(o, v, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return NULL;
    }
    h->n++;
    const char *f = v->format ? v->format : "B";
    if (f[0] == '@' || f[0] == '=') f++;
    if (f[0] != 'f' || f[1] != '\0' || v->itemsize != 4 || v->ndim < 1 || v->ndim > 9) return NULL;
    int last = v->ndim - 1;
    if (v->shape[last] > 1 && v->strides[last] != 4) return NULL;
    for (int i = 0; i < last; i++)
        if (v->strides[i] % 4) return NULL;
    return v;
}

/* The buffer of `o` as a ragged step's heads [1, heads, n, d] (float32, native byte order, d contiguous,
   any strides elsewhere: the view of a projection the Llama family's `heads` returns) into *x; NULL if it
   is not that. */
static Py_buffer *take_heads(Held *h, PyObject *o, TokHeads *x) {
    Py_buffer *v = take_strided(h, o);
    if (!v || v->ndim != 4 || v->shape[0] != 1) return NULL;
    *x = (TokHeads){v->buf, v->strides[2] / 4, v->strides[1] / 4};
    return v;
}

/* ragged_attention(q, k, v, slot_kv, rows, threads, out): the Llama family's ragged step's attention in one
   call: q [1, h, n, d], the new keys k and values v [1, hkv, n, d] (views with any strides but d's); slot_kv
   and rows as ragged_self_attention's, each cache [1, hkv, P, d]; each row's keys and values written into
   its slot, and the attention of its queries over that slot alone into out [1, n, h, d]. */
static PyObject *py_ragged_attention(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t threads;
    if (!check_nargs(na, 7, "ragged_attention") || !as_int64(a[5], &threads)) return NULL;
    TokHeads q, kn, vn;
    Py_buffer *qb = take_heads(&h, a[0], &q), *kb = take_heads(&h, a[1], &kn), *vb = take_heads(&h, a[2], &vn);
    Py_buffer *rb = take(&h, a[4], 'q', 2, 0), *out = take(&h, a[6], 'f', 4, 1);
    if (!qb || !kb || !vb || !rb || !out || !PyList_Check(a[3])) NOT_TAKEN;
    int64_t hq = qb->shape[1], n = qb->shape[2], d = qb->shape[3], hkv = kb->shape[1];
    if (hkv < 1 || hq % hkv || d < 1 || n < 1 || kb->shape[2] != n || kb->shape[3] != d || !same_shape(kb, vb)
        || out->shape[0] != 1 || out->shape[1] != n || out->shape[2] != hq || out->shape[3] != d
        || rb->shape[1] != 4 || rb->shape[0] < 1)
        NOT_TAKEN;
    Slots s;
    int taken = take_slots(a[3], rb, n, hkv, d, &s), rc = 0;
    if (taken > 0) {
        int64_t *m = s.meta, rows = s.rows;
        Py_BEGIN_ALLOW_THREADS
        rc = ragged_attention(q, kn, vn, n, hq, hkv, d, rows, m, m + rows, m + 2 * rows, s.ks, s.vs, m + 3 * rows,
                              out->buf, (int)threads, s.h16);
        Py_END_ALLOW_THREADS
        release_slots(&s);
    }
    release(&h);
    if (rc == KV_OUT_OF_RANGE) return kv_out_of_range();
    if (taken < 0 || rc) return PyErr_NoMemory();
    if (!taken) Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* The buffer of `o` as rows (see RowView): take_strided's, 1 to 9 dimensions. NULL if it is not that. */
static Py_buffer *take_rows(Held *h, PyObject *o, RowView *rv) {
    Py_buffer *v = take_strided(h, o);
    if (!v) return NULL;
    rv->base = v->buf;
    rv->nd = v->ndim - 1;
    for (int i = 0; i < rv->nd; i++) {
        rv->shape[i] = v->shape[i];
        rv->stride[i] = v->strides[i] / 4;
    }
    return v;
}

/* The number of rows of an array of shape `shape` (ndim axes, the last one the row). */
static int64_t rows_of(const Py_buffer *v) {
    int64_t rows = 1;
    for (int i = 0; i < v->ndim - 1; i++) rows *= v->shape[i];
    return rows;
}

/* rms_norm(x, gamma, eps, out): x / sqrt(mean(x^2) + eps) * gamma over the last axis of x (any shape; the
   last axis contiguous, others any strides), into out (contiguous, x's shape). */
static PyObject *py_rms_norm(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    if (!check_nargs(na, 4, "rms_norm")) return NULL;
    double eps = PyFloat_AsDouble(a[2]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    RowView rv;
    const float *gamma;
    Py_buffer *x = take_rows(&h, a[0], &rv);
    if (!x) NOT_TAKEN;
    int64_t c = x->shape[x->ndim - 1], rows = rows_of(x);
    Py_buffer *out = take(&h, a[3], 'f', -1, 1);
    if (!out || c < 1 || !same_shape(out, x) || !take_vector(&h, a[1], c, &gamma) || !gamma) NOT_TAKEN;
    Py_BEGIN_ALLOW_THREADS
    rms_norm_rows(&rv, rows, c, gamma, eps, out->buf);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* silu_mul(gate, up, out): gate / (1 + exp(-gate)) * up elementwise; all three contiguous, one shape. */
static PyObject *py_silu_mul(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    if (!check_nargs(na, 3, "silu_mul")) return NULL;
    Py_buffer *g = take(&h, a[0], 'f', -1, 0), *u = take(&h, a[1], 'f', -1, 0), *out = take(&h, a[2], 'f', -1, 1);
    if (!g || !u || !out || !same_shape(g, u) || !same_shape(out, g)) NOT_TAKEN;
    Py_BEGIN_ALLOW_THREADS
    silu_mul_all(g->buf, u->buf, g->len / 4, out->buf);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* rotary(x, cos, sin, out): x [..., t, d] (the last axis contiguous, others any strides) rotated by the
   angles of each of its t positions, cos and sin [t, d / 2] (contiguous): [x1 cos - x2 sin, x2 cos + x1 sin]
   of its halves x1, x2, into out (contiguous, x's shape). */
static PyObject *py_rotary(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    if (!check_nargs(na, 4, "rotary")) return NULL;
    RowView rv;
    Py_buffer *x = take_rows(&h, a[0], &rv);
    if (!x || x->ndim < 2) NOT_TAKEN;
    int64_t d = x->shape[x->ndim - 1], t = x->shape[x->ndim - 2], rows = rows_of(x);
    Py_buffer *cs = take(&h, a[1], 'f', 2, 0), *sn = take(&h, a[2], 'f', 2, 0), *out = take(&h, a[3], 'f', -1, 1);
    if (!cs || !sn || !out || d % 2 || d < 2 || t < 1 || !same_shape(out, x) || !same_shape(cs, sn)
        || cs->shape[0] != t || cs->shape[1] != d / 2)
        NOT_TAKEN;
    Py_BEGIN_ALLOW_THREADS
    rotary_rows(&rv, rows, t, d / 2, cs->buf, sn->buf, out->buf);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

static PyObject *py_simd(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyLong_FromLong(simd_path());
}

/* force_portable(flag): with flag true, every later call takes the portable C path; false, the detected one. */
static PyObject *py_force_portable(PyObject *self, PyObject *flag) {
    (void)self;
    int portable = PyObject_IsTrue(flag);
    if (portable < 0) return NULL;
    return PyLong_FromLong(limit_path(portable ? PATH_PORTABLE : PATH_AVX512));
}

/* force_avx2(flag): with flag true, every later call takes at most the AVX2 path (AVX-512 machines test
   it so); false, the detected one. */
static PyObject *py_force_avx2(PyObject *self, PyObject *flag) {
    (void)self;
    int avx2 = PyObject_IsTrue(flag);
    if (avx2 < 0) return NULL;
    return PyLong_FromLong(limit_path(avx2 ? PATH_AVX2 : PATH_AVX512));
}

/* amx_rows(rows): int8 products (each chunk of up to MC rows) of at least `rows` rows run on AMX tiles
   where the CPU and OS allow; 0 never, and no tiles at all (attention=bfloat16 then runs on AVX512-BF16
   where the CPU has it: the tests compare the paths so, and INFERNO_HALF_ISA=avx512 sets it); negative,
   the default AMX_ROWS.
   Returns the threshold now set. */
static PyObject *py_amx_rows(PyObject *self, PyObject *arg) {
    (void)self;
    long rows = PyLong_AsLong(arg);
    if (rows == -1 && PyErr_Occurred()) return NULL;
    amx_min_rows = rows < 0 ? AMX_ROWS : rows > MC ? MC : (int)rows;
    return PyLong_FromLong(amx_min_rows);
}

static PyObject *py_amx_support(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyUnicode_FromString(simd_path() == PATH_AVX512 ? amx_support() : "a lesser path is forced");
}

static PyObject *py_amx_bf16_support(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
#if HAVE_AMX
    return PyUnicode_FromString(simd_path() == PATH_AVX512 ? amx_bf16_check() : "a lesser path is forced");
#else
    return PyUnicode_FromString(amx_support());
#endif
}

/* bf16_products() -> (path, why): the path inputs=bfloat16's products take now. */
static PyObject *py_bf16_products(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    const char *why;
    int path = in16_path(&why);
    return Py_BuildValue("(ss)", path == BF16_AMX ? "AMX-BF16" : path == BF16_AVX512 ? "AVX512-BF16" : "", why);
}

/* bf16_attention() -> (path, why): the path attention(..., bf16=True) takes now for a long prompt. */
static PyObject *py_bf16_attention(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    const char *why;
    int bf16 = bf16_attention_path(&why);
    return Py_BuildValue("(ss)", bf16 == BF16_AMX ? "AMX-BF16" : bf16 == BF16_AVX512 ? "AVX512-BF16" : "", why);
}

/* int8_path(rows): the path an int8 product of `rows` rows takes now (its first chunk of up to MC). */
static PyObject *py_int8_path(PyObject *self, PyObject *arg) {
    (void)self;
    long rows = PyLong_AsLong(arg);
    if (rows == -1 && PyErr_Occurred()) return NULL;
    int simd = q8_path(simd_path());
    const char *name = uses_amx(simd, rows < MC ? rows : MC) ? "AMX-INT8" : simd == PATH_AVX512 ? "AVX-512 VNNI"
                       : simd == PATH_AVX2 ? "AVX2" : "portable C";
    return PyUnicode_FromString(name);
}

static PyObject *py_max_threads(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyLong_FromLong(max_threads());
}

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, doc}
static PyMethodDef functions[] = {
    FAST(matmul, "matmul(x, w, n, b, y, fmt, threads, gelu) -> bool: y = x @ w.T + b, w blocked 16-bit."),
    FAST(unpack, "unpack(w, n, j0, j1, k, out, fmt, threads) -> bool: rows j0..j1-1 of w as float32."),
    FAST(unpack_t, "unpack_t(w, n, p0, p1, k, out, fmt, threads) -> bool: panels p0..p1-1 as float32 [k, cols]."),
    FAST(layernorm, "layernorm(x, gamma, beta, eps, out[, threads]) -> bool: layer norm over the last axis "
                    "(a prompt's rows split among the threads)."),
    FAST(attention, "attention(q, k, v, offset, out, threads[, bf16]) -> bool: causal attention over KV caches "
                    "(grouped-query when k, v have fewer heads than q); with bf16 true, a long prompt's in "
                    "bfloat16 where the CPU can (see bf16_attention)."),
    FAST(self_attention, "self_attention(x, w_attn, b_attn, w_proj, b_proj, k, v, offset, n_head, fmt, "
                         "threads, out) -> bool: a decode step's attention block."),
    FAST(ragged_self_attention, "ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, "
                                "n_head, fmt, threads, out) -> bool: a ragged step's attention block."),
    FAST(gated_mlp, "gated_mlp(x, w_gate, w_up, f, w_down, fmt, threads, out) -> bool: the Llama family's MLP "
                    "(silu(x @ w_gate) * (x @ w_up)) @ w_down in one call."),
    FAST(linears, "linears(x, ws, ns, bs, fmt, threads, outs) -> bool: the products of one input by 1 to 3 "
                  "weights in one call."),
    FAST(ragged_attention, "ragged_attention(q, k, v, slot_kv, rows, threads, out) -> bool: the Llama family's "
                           "ragged step's attention (grouped-query), the new keys and values written first."),
    FAST(mlp, "mlp(x, w_fc, f, b_fc, w_proj, b_proj, fmt, threads, out) -> bool: a decode step's MLP."),
    FAST(rms_norm, "rms_norm(x, gamma, eps, out) -> bool: RMS norm over the last axis."),
    FAST(silu_mul, "silu_mul(gate, up, out) -> bool: silu(gate) * up, elementwise."),
    FAST(rotary, "rotary(x, cos, sin, out) -> bool: the rotary position embedding of x [..., t, d]."),
    {"simd", py_simd, METH_NOARGS, "simd() -> 2 on the AVX-512 path, 1 on AVX2 + FMA + F16C, 0 on portable C."},
    {"force_portable", py_force_portable, METH_O,
     "force_portable(flag) -> simd(): with flag true, every later call takes the portable C path."},
    {"force_avx2", py_force_avx2, METH_O,
     "force_avx2(flag) -> simd(): with flag true, every later call takes at most the AVX2 path."},
    {"amx_rows", py_amx_rows, METH_O,
     "amx_rows(rows) -> rows: int8 products of at least `rows` rows run on AMX tiles where the CPU and OS "
     "allow (0: never, nor any other tiles; negative: the default)."},
    {"amx_support", py_amx_support, METH_NOARGS,
     "amx_support() -> '' where AMX int8 tiles can run, else why not (the CPU, the OS, the kernel, or a lesser "
     "path forced)."},
    {"amx_bf16_support", py_amx_bf16_support, METH_NOARGS,
     "amx_bf16_support() -> '' where attention(..., bf16=True) runs on AMX-BF16 tiles, else why not."},
    {"bf16_products", py_bf16_products, METH_NOARGS,
     "bf16_products() -> (path, why): 'AMX-BF16' where inputs=bfloat16's products run on AMX tiles, "
     "'AVX512-BF16' where on VDPBF16PS (why: why not AMX), else '' and why not: their inputs stay float32."},
    {"bf16_attention", py_bf16_attention, METH_NOARGS,
     "bf16_attention() -> (path, why): 'AMX-BF16' or 'AVX512-BF16', the path attention(..., bf16=True) takes "
     "for a long prompt, or '' (then it runs in float32); why: why not AMX-BF16, or why neither."},
    {"int8_path", py_int8_path, METH_O,
     "int8_path(rows) -> the path an int8 product of `rows` rows takes now: 'AMX-INT8', 'AVX-512 VNNI', "
     "'AVX2' or 'portable C'."},
    {"max_threads", py_max_threads, METH_NOARGS, "max_threads() -> the most threads a call may use."},
    {NULL, NULL, 0, NULL}};

#ifdef INFERNO_HALF_EMULATE_AMX /* the tests' build, a module of its own (_amx_emulated.h) */
#define MODULE_NAME "_kernels_amx_emulated"
#define MODULE_INIT PyInit__kernels_amx_emulated
#else
#define MODULE_NAME "_kernels"
#define MODULE_INIT PyInit__kernels
#endif
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, MODULE_NAME,
                                    "inferno-gpt2-half's C kernels (see the comment at the top of _kernels.c).", -1,
                                    functions, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC MODULE_INIT(void) { return PyModule_Create(&module); }
