/* inferno-gpt2-half's compiled kernels: matrix products with 16-bit weights and float32 everything else.

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

   Python calls them through the functions at the end of this file, which take NumPy arrays. */

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
#ifndef PREFETCH
#define PREFETCH 2048 /* weights (2 bytes each): 4 KB */
#endif

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
                /* 4 KB ahead of the stream. 1 KB ahead was 20% faster than the hardware prefetcher alone
                   (on Zen 4); on this Zen 5 host the 49 products of a step took 4.8-5.3 ms 4 KB ahead
                   against 6.0-6.4 ms 1 KB ahead (medians of 12 interleaved rounds, three runs). */
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
static int simd_path(void) {
#if HAVE_X86
    if (use_x86 < 0) use_x86 = cpu_has_x86();
    return use_x86;
#else
    return 0;
#endif
}

/* With `portable` 1, every later call takes the portable C path even where the CPU has AVX2 (the tests
   run it so on x86 machines; it is what ARM and older CPUs run); 0 goes back to the detected path.
   Returns simd_path() after the change. */
static int force_portable(int portable) {
#if HAVE_X86
    use_x86 = portable ? 0 : cpu_has_x86();
#else
    (void)portable;
#endif
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

/* y = x @ w.T + b, see the top of the file: x is [M, kp] (kp = K padded to a multiple of 8, the padding
   zero), w the blocked weights of N rows (N padded to np8), y [M, N]; with `act` 1, y = gelu_new(x @ w.T
   + b) (the MLP's first product). The 8-row blocks are split among `threads` threads. Returns 0. */
static int matmul_blocks(const float *x, int64_t m_rows, int64_t kp, const uint16_t *w, int64_t n,
                        const float *b, float *y, int fmt, int threads, int act) {
    int64_t blocks = (n + 7) / 8, per = 8;  /* 64 output rows per task */
    int64_t tasks = (blocks + per - 1) / per;
    int simd = simd_path();
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

/* The float32 rows j0 .. j1 - 1 of the blocked weights, as a plain [j1 - j0, k]
   array (k <= kp: the padding columns are left out). For products of many rows, which BLAS does faster
   on float32 weights than any kernel here. Split among `threads` threads. Returns 0. */
static int unpack_rows(const uint16_t *w, int64_t kp, int64_t j0, int64_t j1, int64_t k, float *dst,
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
        if (simd_path()) i = unpack_row_x86(blk, k, row, fmt);
#endif
        for (; i < k; i++) row[i] = widen(blk[(i / 8) * 64 + i % 8], fmt);
    }
    return 0;
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
    int simd = HAVE_X86 && d % 8 == 0 && simd_path();
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

/* The attention of a decode step from the fused projection: qkv [b, t, 3, h, d] (the c_attn product of b
   sequences of t new tokens, bias added) → the keys and values written into the caches k, v [b, h, l, d]
   at positions offset .. offset + t - 1, and the attention of the queries into out [b, t, h, d] (the
   layout c_proj takes). One call instead of NumPy's head split, two cache writes, a query copy and the
   head merge. Returns 0. */
static int qkv_attention(const float *qkv, int64_t b, int64_t t, int64_t h, int64_t d, float *k, float *v,
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

/* ------------------------------------------------------------ the Python functions (buffer protocol)
   Arrays come in through the buffer protocol, ~0.05 us an array: through ctypes, a NumPy array's
   .ctypes.data alone cost 0.8 us, and a decode step passed ~250 of them (1 ms of a ~6 ms step, measured
   on the development machine). Each function checks what it is given (dtype, C order, shape) and, when
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
    if (f[0] != code || f[1] != '\0' || v->itemsize != (code == 'f' ? 4 : 2)) return NULL;
    if (ndim >= 0 ? v->ndim != ndim : v->ndim < 1) return NULL;
    return v;
}

/* Blocked 16-bit weights of n output rows over k inputs (see the top of the file): a uint16 array
   [ceil(n/8), ceil(k/8), 8, 8]. Its padded width kp is set. NULL if it is not that. */
static Py_buffer *take_weight(Held *h, PyObject *o, int64_t n, int64_t k, int64_t *kp) {
    Py_buffer *v = take(h, o, 'H', 4, 0);
    if (!v || n < 1 || k < 1 || v->shape[0] != (n + 7) / 8 || v->shape[1] != (k + 7) / 8 || v->shape[2] != 8
        || v->shape[3] != 8)
        return NULL;
    *kp = v->shape[1] * 8;
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
static int known_format(int64_t fmt) { return fmt == FMT_F16 || fmt == FMT_BF16; }

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

/* y [m, n] = x [m, k] @ w.T + b (then gelu_new with act), copying x into a zero-padded buffer where k is
   not a multiple of 8. Returns 0, or -1 out of memory. Runs without the GIL. */
static int product(const float *x, int64_t m, int64_t k, const uint16_t *w, int64_t kp, int64_t n, const float *b,
                   float *y, int fmt, int threads, int act) {
    float *pad = NULL;
    if (k != kp) {
        pad = calloc((size_t)(m * kp), sizeof(float));
        if (!pad) return -1;
        for (int64_t r = 0; r < m; r++) memcpy(pad + r * kp, x + r * k, sizeof(float) * (size_t)k);
        x = pad;
    }
    matmul_blocks(x, m, kp, w, n, b, y, fmt, threads, act);
    free(pad);
    return 0;
}

#define NOT_TAKEN do { release(&h); Py_RETURN_FALSE; } while (0)

/* matmul(x, w, n, b, y, fmt, threads, gelu): y [m, n] = x [m, k] @ the blocked w (n rows) .T + b (None:
   none), gelu_new after with gelu true. */
static PyObject *py_matmul(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t n, fmt, threads, kp;
    if (!check_nargs(na, 8, "matmul") || !as_int64(a[2], &n) || !as_int64(a[5], &fmt) || !as_int64(a[6], &threads))
        return NULL;
    int act = PyObject_IsTrue(a[7]);
    if (act < 0) return NULL;
    const float *b;
    Py_buffer *x = take(&h, a[0], 'f', 2, 0);
    if (!x) NOT_TAKEN;
    int64_t m = x->shape[0], k = x->shape[1];
    Py_buffer *w = take_weight(&h, a[1], n, k, &kp);
    Py_buffer *y = take(&h, a[4], 'f', 2, 1);
    if (!w || !y || !known_format(fmt) || !take_vector(&h, a[3], n, &b) || y->shape[0] != m || y->shape[1] != n)
        NOT_TAKEN;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = product(x->buf, m, k, w->buf, kp, n, b, y->buf, (int)fmt, (int)threads, act);
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
    int64_t n, j0, j1, k, fmt, threads, kp;
    if (!check_nargs(na, 8, "unpack") || !as_int64(a[1], &n) || !as_int64(a[2], &j0) || !as_int64(a[3], &j1)
        || !as_int64(a[4], &k) || !as_int64(a[6], &fmt) || !as_int64(a[7], &threads))
        return NULL;
    Py_buffer *w = take_weight(&h, a[0], n, k, &kp);
    Py_buffer *out = take(&h, a[5], 'f', 2, 1);
    if (!w || !out || !known_format(fmt) || j0 < 0 || j1 > n || j1 < j0 || out->shape[0] != j1 - j0
        || out->shape[1] != k)
        NOT_TAKEN;
    Py_BEGIN_ALLOW_THREADS
    unpack_rows(w->buf, kp, j0, j1, k, out->buf, (int)fmt, (int)threads);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* layernorm(x, gamma, beta, eps, out): over the last axis of x (any shape), into out (the same shape). */
static PyObject *py_layernorm(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    if (!check_nargs(na, 5, "layernorm")) return NULL;
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
    layernorm_rows(x->buf, rows, c, gamma, beta, eps, out->buf);
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_TRUE;
}

/* Whether k and v are KV caches [b, h, l, d] with room for positions offset .. offset + t - 1. */
static int caches_fit(Py_buffer *k, Py_buffer *v, int64_t b, int64_t hd, int64_t d, int64_t offset, int64_t t) {
    if (!k || !v || offset < 0 || k->buf == v->buf) return 0;
    for (int i = 0; i < 4; i++)
        if (k->shape[i] != v->shape[i]) return 0;
    return k->shape[0] == b && k->shape[1] == hd && k->shape[3] == d && k->shape[2] >= offset + t;
}

/* attention(q, k, v, offset, out, threads): causal attention of the queries q [b, h, t, d] at positions
   offset .. offset + t - 1 over the caches k, v [b, h, l, d], into out [b, h, t, d]. */
static PyObject *py_attention(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t offset, threads;
    if (!check_nargs(na, 6, "attention") || !as_int64(a[3], &offset) || !as_int64(a[5], &threads)) return NULL;
    Py_buffer *q = take(&h, a[0], 'f', 4, 0);
    if (!q) NOT_TAKEN;
    int64_t b = q->shape[0], hd = q->shape[1], t = q->shape[2], d = q->shape[3];
    Py_buffer *k = take(&h, a[1], 'f', 4, 0), *v = take(&h, a[2], 'f', 4, 0), *out = take(&h, a[4], 'f', 4, 1);
    if (!caches_fit(k, v, b, hd, d, offset, t) || !out || !same_shape(out, q) || d < 1 || t < 1) NOT_TAKEN;
    int64_t l = k->shape[2];
    Py_BEGIN_ALLOW_THREADS
    attend_all(b, hd, t, d, q->buf, hd * t * d, t * d, d, k->buf, v->buf, l, offset, out->buf, hd * t * d, t * d, d,
               (int)threads);
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
    int64_t offset, n_head, fmt, threads, kp_attn, kp_proj;
    if (!check_nargs(na, 12, "self_attention") || !as_int64(a[7], &offset) || !as_int64(a[8], &n_head)
        || !as_int64(a[9], &fmt) || !as_int64(a[10], &threads))
        return NULL;
    const float *b_attn, *b_proj;
    Py_buffer *x = take(&h, a[0], 'f', 3, 0);
    if (!x || n_head < 1) NOT_TAKEN;
    int64_t b = x->shape[0], t = x->shape[1], c = x->shape[2], m = b * t, d = c / n_head;
    Py_buffer *wa = take_weight(&h, a[1], 3 * c, c, &kp_attn), *wp = take_weight(&h, a[3], c, c, &kp_proj);
    Py_buffer *k = take(&h, a[5], 'f', 4, 1), *v = take(&h, a[6], 'f', 4, 1), *out = take(&h, a[11], 'f', 3, 1);
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
    rc = product(x->buf, m, c, wa->buf, kp_attn, 3 * c, b_attn, qkv, (int)fmt, (int)threads, 0);
    if (!rc) qkv_attention(qkv, b, t, n_head, d, k->buf, v->buf, l, offset, y, (int)threads);
    if (!rc) rc = product(y, m, c, wp->buf, kp_proj, c, b_proj, out->buf, (int)fmt, (int)threads, 0);
    Py_END_ALLOW_THREADS
    free(qkv);
    release(&h);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* mlp(x, w_fc, f, b_fc, w_proj, b_proj, fmt, threads, out): out [m, c] = gelu_new(x [m, c] @ w_fc (f rows)
   + b_fc) @ w_proj (c rows) + b_proj: the MLP of a decode step in one call, the GELU inside the first
   product. */
static PyObject *py_mlp(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    (void)self;
    Held h = {.n = 0};
    int64_t f, fmt, threads, kp_fc, kp_proj;
    if (!check_nargs(na, 9, "mlp") || !as_int64(a[2], &f) || !as_int64(a[6], &fmt) || !as_int64(a[7], &threads))
        return NULL;
    const float *b_fc, *b_proj;
    Py_buffer *x = take(&h, a[0], 'f', 2, 0);
    if (!x) NOT_TAKEN;
    int64_t m = x->shape[0], c = x->shape[1];
    Py_buffer *wf = take_weight(&h, a[1], f, c, &kp_fc), *wp = take_weight(&h, a[4], c, f, &kp_proj);
    Py_buffer *out = take(&h, a[8], 'f', 2, 1);
    if (!wf || !wp || !out || !known_format(fmt) || !same_shape(out, x) || !take_vector(&h, a[3], f, &b_fc)
        || !take_vector(&h, a[5], c, &b_proj))
        NOT_TAKEN;
    float *hidden = malloc(sizeof(float) * (size_t)(m * f));
    if (!hidden) { release(&h); return PyErr_NoMemory(); }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = product(x->buf, m, c, wf->buf, kp_fc, f, b_fc, hidden, (int)fmt, (int)threads, 1);
    if (!rc) rc = product(hidden, m, f, wp->buf, kp_proj, c, b_proj, out->buf, (int)fmt, (int)threads, 0);
    Py_END_ALLOW_THREADS
    free(hidden);
    release(&h);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

static PyObject *py_simd(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyLong_FromLong(simd_path());
}

static PyObject *py_force_portable(PyObject *self, PyObject *flag) {
    (void)self;
    int portable = PyObject_IsTrue(flag);
    if (portable < 0) return NULL;
    return PyLong_FromLong(force_portable(portable));
}

static PyObject *py_max_threads(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyLong_FromLong(max_threads());
}

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, doc}
static PyMethodDef functions[] = {
    FAST(matmul, "matmul(x, w, n, b, y, fmt, threads, gelu) -> bool: y = x @ w.T + b, w blocked 16-bit."),
    FAST(unpack, "unpack(w, n, j0, j1, k, out, fmt, threads) -> bool: rows j0..j1-1 of w as float32."),
    FAST(layernorm, "layernorm(x, gamma, beta, eps, out) -> bool: layer norm over the last axis."),
    FAST(attention, "attention(q, k, v, offset, out, threads) -> bool: causal attention over KV caches."),
    FAST(self_attention, "self_attention(x, w_attn, b_attn, w_proj, b_proj, k, v, offset, n_head, fmt, "
                         "threads, out) -> bool: a decode step's attention block."),
    FAST(mlp, "mlp(x, w_fc, f, b_fc, w_proj, b_proj, fmt, threads, out) -> bool: a decode step's MLP."),
    {"simd", py_simd, METH_NOARGS, "simd() -> 1 on the AVX2 + FMA + F16C path, 0 on portable C."},
    {"force_portable", py_force_portable, METH_O,
     "force_portable(flag) -> simd(): with flag true, every later call takes the portable C path."},
    {"max_threads", py_max_threads, METH_NOARGS, "max_threads() -> the most threads a call may use."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "inferno-gpt2-half's C kernels (see the comment at the top of _kernels.c).", -1,
                                    functions, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
