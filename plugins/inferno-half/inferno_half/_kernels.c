/* inferno-half's compiled kernels: matrix products with 16-bit weights and float32 everything else.

   y[m, j] = b[j] + sum_k x[m, k] * w[j, k]      x: float32 [M, K], w: 16-bit [N, K] (row j = output j),
                                                  b: float32 [N] or NULL, y: float32 [M, N]

   w is stored blocked, as packed once at load by inferno_half.backend.pack: N and K padded with zeros to
   multiples of 8, then [N/8][K/8][8 rows][8 columns], so that the kernel reads it strictly in order
   (eight interleaved row streams measured 30 GB/s on the development machine, the blocked stream 45+).

   A decode step is one such product per weight matrix with M = 1, bound by how fast the weights stream
   from memory: 16-bit weights halve the bytes. Each weight is widened to float32 in registers and
   accumulated in float32, so only the weights are rounded, never the activations or the sums.

   Two weight formats: IEEE float16 (FMT_F16) and bfloat16 (FMT_BF16, the top half of a float32).
   An AVX2 + FMA + F16C path is chosen at run time where the CPU has it; otherwise portable C.
   The output rows are split among OpenMP threads where the compiler supports OpenMP.

   The functions are plain C, called through ctypes; the Python module around them is empty. */

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

/* GPT-2's tanh GELU as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same function, since
   (1 + tanh(u)) / 2 = 1 / (1 + e^(-2u)). */
static float gelu_new(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

/* Output rows of the 8-row blocks jb0 .. jb1 - 1, for every input row (then gelu_new, with `act`). */
static void blocks_portable(const float *x, int64_t m_rows, int64_t kp, const uint16_t *w, int64_t jb0,
                            int64_t jb1, const float *b, float *y, int64_t n, int fmt, int act) {
    for (int64_t jb = jb0; jb < jb1; jb++) {
        const uint16_t *blk = w + jb * 8 * kp;
        for (int64_t m = 0; m < m_rows; m++) {
            const float *xm = x + m * kp;
            float acc[8] = {0};
            for (int64_t i = 0; i < kp; i += 8)
                for (int r = 0; r < 8; r++)
                    for (int c = 0; c < 8; c++) acc[r] += xm[i + c] * widen(blk[i * 8 + r * 8 + c], fmt);
            for (int r = 0; r < 8 && jb * 8 + r < n; r++) {
                float v = acc[r] + (b ? b[jb * 8 + r] : 0.0f);
                y[m * n + jb * 8 + r] = act ? gelu_new(v) : v;
            }
        }
    }
}

/* ------------------------------------------------------------------------- AVX2 + FMA + F16C (x86) */

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_X86 1
#include <immintrin.h>

#define X86 __attribute__((target("avx2,fma,f16c")))
#define PREFETCH 512 /* weights (2 bytes each) */

X86 static inline __m256 load8(const uint16_t *p, int fmt) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (fmt == FMT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

X86 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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

/* gelu_new of 8 values (see the portable gelu_new). */
X86 static inline __m256 gelu8(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.7978845608028654f),
                             _mm256_fmadd_ps(x3, _mm256_set1_ps(0.044715f), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(u)));
}

/* One 8-row block for one input row: eight independent accumulators (both FMA units busy despite their
   latency) fed by one sequential stream of weights. For more input rows the block is read again, from
   the cache (8 rows x K x 2 bytes: 12 KB for K = 768, 48 KB for 3072). */
X86 static void blocks_x86(const float *x, int64_t m_rows, int64_t kp, const uint16_t *w, int64_t jb0,
                           int64_t jb1, const float *b, float *y, int64_t n, int fmt, int act) {
    for (int64_t jb = jb0; jb < jb1; jb++) {
        const uint16_t *blk = w + jb * 8 * kp;
        for (int64_t m = 0; m < m_rows; m++) {
            const float *xm = x + m * kp;
            const uint16_t *p = blk;
            __m256 acc[8];
            for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
            for (int64_t i = 0; i < kp; i += 8, p += 64) {
                __m256 xv = _mm256_loadu_ps(xm + i);
                /* 1 KB ahead of the stream: measured 20% faster than the hardware prefetcher alone. */
                _mm_prefetch((const char *)(p + PREFETCH), _MM_HINT_T0);
                _mm_prefetch((const char *)(p + PREFETCH + 32), _MM_HINT_T0);
                for (int r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(load8(p + r * 8, fmt), xv, acc[r]);
            }
            float out[8];
            for (int r = 0; r < 8; r++) out[r] = hsum(acc[r]) + (b && jb * 8 + r < n ? b[jb * 8 + r] : 0.0f);
            if (act) _mm256_storeu_ps(out, gelu8(_mm256_loadu_ps(out)));
            for (int r = 0; r < 8 && jb * 8 + r < n; r++) y[m * n + jb * 8 + r] = out[r];
        }
    }
}

/* Columns 0 .. k - k % 8 - 1 of one row of the blocked weights, widened; returns how many were done. */
X86 static int64_t unpack_row_x86(const uint16_t *blk, int64_t k, float *row, int fmt) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(row + i, load8(blk + i * 8, fmt));
    return i;
}

static int cpu_has_x86(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#else
#define HAVE_X86 0
#endif

/* ------------------------------------------------------------------------------------ entry points */

#if HAVE_X86
static int use_x86 = -1;
#endif

/* Which code path runs here: 1 = AVX2 + FMA + F16C, 0 = portable C. */
int inferno_half_simd(void) {
#if HAVE_X86
    if (use_x86 < 0) use_x86 = cpu_has_x86();
    return use_x86;
#else
    return 0;
#endif
}

/* With `portable` 1, every later call takes the portable C path even where the CPU has AVX2 (the tests
   run it so on x86 machines; it is what ARM and older CPUs run); 0 goes back to the detected path.
   Returns inferno_half_simd() after the change. */
int inferno_half_force_portable(int portable) {
#if HAVE_X86
    use_x86 = portable ? 0 : cpu_has_x86();
#else
    (void)portable;
#endif
    return inferno_half_simd();
}

/* The largest number of threads a call may use (1 without OpenMP). */
int inferno_half_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* y = x @ w.T + b, see the top of the file: x is [M, kp] (kp = K padded to a multiple of 8, the padding
   zero), w the blocked weights of N rows (N padded to np8), y [M, N]; with `act` 1, y = gelu_new(x @ w.T
   + b) (the MLP's first product). The 8-row blocks are split among `threads` threads. Returns 0. */
int inferno_half_matmul(const float *x, int64_t m_rows, int64_t kp, const uint16_t *w, int64_t n,
                        const float *b, float *y, int fmt, int threads, int act) {
    int64_t blocks = (n + 7) / 8, per = 8;  /* 64 output rows per task */
    int64_t tasks = (blocks + per - 1) / per;
    int simd = inferno_half_simd();
    (void)threads; (void)simd;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads > 1)
#endif
    for (int64_t t = 0; t < tasks; t++) {
        int64_t jb0 = t * per, jb1 = jb0 + per < blocks ? jb0 + per : blocks;
#if HAVE_X86
        if (simd) { blocks_x86(x, m_rows, kp, w, jb0, jb1, b, y, n, fmt, act); continue; }
#endif
        blocks_portable(x, m_rows, kp, w, jb0, jb1, b, y, n, fmt, act);
    }
    return 0;
}

/* The float32 rows j0 .. j1 - 1 (j0 a multiple of 8) of the blocked weights, as a plain [j1 - j0, k]
   array (k <= kp: the padding columns are left out). For products of many rows, which BLAS does faster
   on float32 weights than any kernel here. Split among `threads` threads. Returns 0. */
int inferno_half_unpack(const uint16_t *w, int64_t kp, int64_t j0, int64_t j1, int64_t k, float *dst,
                        int fmt, int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads > 1)
#endif
    for (int64_t j = j0; j < j1; j++) {
        const uint16_t *blk = w + (j / 8) * 8 * kp + (j % 8) * 8;
        float *row = dst + (j - j0) * k;
        int64_t i = 0;
#if HAVE_X86
        if (inferno_half_simd()) i = unpack_row_x86(blk, k, row, fmt);
#endif
        for (; i < k; i++) row[i] = widen(blk[(i / 8) * 64 + i % 8], fmt);
    }
    return 0;
}

/* ----------------------------------------------------- the small kernels of a decode step, in C
   At one token per step a layer norm or an attention over the cache is a few microseconds of work
   behind tens of microseconds of NumPy calls; these run them in one call each. */


/* Layer norm over the last axis of x [rows, c] (biased variance, sums in double), into out. */
int inferno_half_layernorm(const float *x, int64_t rows, int64_t c, const float *gamma, const float *beta,
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
X86 static inline float dot_x86(const float *a, const float *b, int64_t d) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 8), _mm256_loadu_ps(b + c + 8), a1);
    }
    if (c < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), a0);
    return hsum(_mm256_add_ps(a0, a1));
}

/* One query over `keys` keys, d a multiple of 8, in three passes: the scores (8-wide dot products)
   into `s`, their exponentials (8 at a time), then the weighted sum of the values. The portable loop
   below (one scalar chain per dot product, a libm expf per key) took 41 us a layer at 100 cached
   tokens on the development machine; this under 10. */
X86 static void attend_x86(const float *qi, const float *kh, const float *vh, int64_t keys, int64_t d,
                           float scale, float *s, float *o) {
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < keys; j++) {
        s[j] = dot_x86(qi, kh + j * d, d) * scale;
        if (s[j] > m) m = s[j];
    }
    int64_t j = 0;
    __m256 vm = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
    for (; j + 8 <= keys; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        vs = _mm256_add_ps(vs, e);
    }
    sum = hsum(vs);
    for (; j < keys; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
    for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_setzero_ps());
    for (j = 0; j < keys; j++) {
        const float *vj = vh + j * d;
        __m256 p = _mm256_set1_ps(s[j]);
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(o + c, _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + c), _mm256_loadu_ps(o + c)));
    }
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), inv));
}
#endif

/* Scores per query on the stack up to this many keys (16 KB), else on the heap. */
#define STACK_KEYS 4096

/* One query over `keys` keys, portable C: one pass with a running maximum (online softmax), so no score
   buffer. */
static void attend_portable(const float *qi, const float *kh, const float *vh, int64_t keys, int64_t d,
                            float scale, float *o) {
    float m = -INFINITY, sum = 0.0f;
    for (int64_t c = 0; c < d; c++) o[c] = 0.0f;
    for (int64_t j = 0; j < keys; j++) {
        const float *kj = kh + j * d, *vj = vh + j * d;
        float s = 0.0f;
        for (int64_t c = 0; c < d; c++) s += qi[c] * kj[c];
        s *= scale;
        if (s > m) {  /* a new maximum: rescale what was summed so far */
            float f = expf(m - s);
            sum *= f;
            for (int64_t c = 0; c < d; c++) o[c] *= f;
            m = s;
        }
        float e = expf(s - m);
        sum += e;
        for (int64_t c = 0; c < d; c++) o[c] += e * vj[c];
    }
    for (int64_t c = 0; c < d; c++) o[c] /= sum;
}

/* Causal attention of b sequences with h heads of size d: the caches k and v are [b, h, l, d]; the t
   queries of each sequence sit at positions offset .. offset + t - 1 and query i attends keys
   0 .. offset + i. Query (s, head, i) is read at q + s * q_s + head * q_h + i * q_t and its result
   written at out + s * o_s + head * o_h + i * o_t (strides in floats), so that the caller's layout,
   [b, h, t, d] or a fused [b, t, 3, h, d], needs no copy. */
static void attend_all(int64_t b, int64_t h, int64_t t, int64_t d, const float *q, int64_t q_s, int64_t q_h,
                       int64_t q_t, const float *k, const float *v, int64_t l, int64_t offset, float *out,
                       int64_t o_s, int64_t o_h, int64_t o_t, int threads) {
    float scale = 1.0f / sqrtf((float)d);
    int simd = HAVE_X86 && d % 8 == 0 && inferno_half_simd();
    float *heap = NULL;
    if (simd && offset + t > STACK_KEYS) {
        heap = malloc(sizeof(float) * (size_t)(offset + t) * (size_t)(b * h * t));
        if (!heap) simd = 0;  /* out of memory: the portable path needs no buffer */
    }
    (void)threads; (void)simd;
    /* Split among the threads from ~43 keys a head at 12 heads: a decode step's attention reads its
       cache from memory (evicted by the weights), 38 us a layer at 100 keys on one thread; on two the
       whole step measured 3% faster (6.09 -> 5.90 ms, 14 paired rounds). */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads > 1 && (offset + t) * t * h * b >= 512)
#endif
    for (int64_t n = 0; n < b * h * t; n++) {
        int64_t seq = n / (h * t), head = n / t % h, i = n % t, keys = offset + i + 1;
        const float *qi = q + seq * q_s + head * q_h + i * q_t;
        const float *kh = k + (seq * h + head) * l * d, *vh = v + (seq * h + head) * l * d;
        float *o = out + seq * o_s + head * o_h + i * o_t;
#if HAVE_X86
        if (simd) {
            float buf[STACK_KEYS];
            attend_x86(qi, kh, vh, keys, d, scale, heap ? heap + n * (offset + t) : buf, o);
            continue;
        }
#endif
        attend_portable(qi, kh, vh, keys, d, scale, o);
    }
    free(heap);
}

/* Causal attention of one sequence: q [h, t, d], k and v the cache [h, l, d], out [h, t, d] (see
   attend_all). Returns 0. */
int inferno_half_attention(const float *q, int64_t h, int64_t t, int64_t d, const float *k, const float *v,
                           int64_t l, int64_t offset, float *out, int threads) {
    attend_all(1, h, t, d, q, 0, t * d, d, k, v, l, offset, out, 0, t * d, d, threads);
    return 0;
}

/* The attention of a decode step from the fused projection: qkv [b, t, 3, h, d] (the c_attn product of b
   sequences of t new tokens, bias added) → the keys and values written into the caches k, v [b, h, l, d]
   at positions offset .. offset + t - 1, and the attention of the queries into out [b, t, h, d] (the
   layout c_proj takes). One call instead of NumPy's head split, two cache writes, a query copy and the
   head merge. Returns 0. */
int inferno_half_qkv_attention(const float *qkv, int64_t b, int64_t t, int64_t h, int64_t d, float *k, float *v,
                               int64_t l, int64_t offset, float *out, int threads) {
    int64_t c = h * d;
    for (int64_t seq = 0; seq < b; seq++)
        for (int64_t i = 0; i < t; i++)
            for (int64_t head = 0; head < h; head++) {
                const float *row = qkv + (seq * t + i) * 3 * c + head * d;
                int64_t at = ((seq * h + head) * l + offset + i) * d;
                memcpy(k + at, row + c, sizeof(float) * (size_t)d);
                memcpy(v + at, row + 2 * c, sizeof(float) * (size_t)d);
            }
    attend_all(b, h, t, d, qkv, t * 3 * c, d, 3 * c, k, v, l, offset, out, t * c, d, c, threads);
    return 0;
}

/* An importable module, so that setuptools builds and installs this file like any extension; Python
   finds its path and ctypes loads the functions above from it. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "inferno-half's C kernels (see ctypes)",
                                    -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
