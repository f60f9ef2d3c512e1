/* The peak multiply-add rate of one core's vector dot-product instructions (#44): which one the compute-bound
   products and attention should run on, on this CPU. Each is a loop of 12 independent accumulators (so
   the instruction's throughput, not its latency, bounds it), timed in thread CPU time:

     FMA          VFMADD231PS zmm: 16 float32 multiply-adds (the 16-bit formats' products, float32 attention)
     VNNI         VPDPBUSD zmm: 64 int8 x uint8 multiply-adds into int32 (int8 and q4 products)
     AVX512-BF16  VDPBF16PS zmm: 32 bfloat16 multiply-adds into float32 (attention=bfloat16 without AMX)

   and on AVX2 (ymm; a CPU without AVX-512, or the paths INFERNO_HALF_ISA=avx2 forces), one "instruction"
   being the sequence a product's inner loop runs for 32 int8 multiply-adds:

     FMA          VFMADD231PS ymm: 8 float32 multiply-adds
     int8         VPSIGNB, VPMADDUBSW, VPMADDWD, VPADDD: the int8 products' (as llama.cpp's q8_0 on AVX2)
     q4           VPMADDUBSW, VPADDW, and one VPMADDWD + VPADDD a block of 8: q4's (sums in int16 a block)

   Build and run (x86-64, GCC 10+):

     gcc -O2 benches/dot_peaks.c -o /tmp/dot_peaks && /tmp/dot_peaks

   Prints each instruction's rate (G instructions/s) and its GOP/s (2 per multiply-add), or
   why it cannot run here (the CPU lacks the feature). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ACC 12
#define ITERS 100000000L

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx512f"))) static float fma_loop(long iters) {
    __m512 a[ACC], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < ACC; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    __m512 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) static float vnni_loop(long iters) {
    __m512i a[ACC], b = _mm512_set1_epi8(1), c = _mm512_set1_epi8(2);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_epi32(i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < ACC; i++) a[i] = _mm512_dpbusd_epi32(a[i], b, c);
    __m512i s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_epi32(s, a[i]);
    return (float)_mm512_reduce_add_epi32(s);
}

__attribute__((target("avx512f,avx512bf16"))) static float bf16_loop(long iters) {
    __m512 a[ACC];
    __m512bh b = (__m512bh)_mm512_set1_epi16(0x3F80), c = (__m512bh)_mm512_set1_epi16(0x3380);  /* 1, ~6e-8 */
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < ACC; i++) a[i] = _mm512_dpbf16_ps(a[i], b, c);
    __m512 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma256_loop(long iters) {
    __m256 a[ACC], b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < ACC; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    __m256 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, a[i]);
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0];
}

/* AVX2's 16 registers hold 6 chains here, each its own weights; the input changes every step (one add
   for the 6 chains), else the compiler hoists the loop-invariant products out of the loop. */
#define ACC2 6
__attribute__((target("avx2"))) static float int8_256_loop(long iters) {
    __m256i a[ACC2], w[ACC2], x = _mm256_set1_epi8(3), step = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
#pragma GCC unroll 6
    for (int i = 0; i < ACC2; i++) a[i] = _mm256_setzero_si256(), w[i] = _mm256_set1_epi8((char)(i - 3));
    for (long it = 0; it < iters; it++) {
        x = _mm256_add_epi8(x, step);
        __m256i ax = _mm256_abs_epi8(x);
#pragma GCC unroll 6
        for (int i = 0; i < ACC2; i++)
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w[i], x)), ones));
    }
    __m256i s = a[0];
    for (int i = 1; i < ACC2; i++) s = _mm256_add_epi32(s, a[i]);
    return (float)_mm256_extract_epi32(s, 0);
}

__attribute__((target("avx2"))) static float q4_256_loop(long iters) {  /* iters / 8 blocks of 8 groups */
    __m256i a[ACC2], w[ACC2], x = _mm256_set1_epi8(3), step = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
#pragma GCC unroll 6
    for (int i = 0; i < ACC2; i++) a[i] = _mm256_setzero_si256(), w[i] = _mm256_set1_epi8((char)(i + 1));
    for (long it = 0; it < iters / 8; it++) {
        __m256i h[ACC2];
#pragma GCC unroll 6
        for (int i = 0; i < ACC2; i++) h[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            x = _mm256_add_epi8(x, step);
#pragma GCC unroll 6
            for (int i = 0; i < ACC2; i++) h[i] = _mm256_add_epi16(h[i], _mm256_maddubs_epi16(w[i], x));
        }
#pragma GCC unroll 6
        for (int i = 0; i < ACC2; i++) a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(h[i], ones));
    }
    __m256i s = a[0];
    for (int i = 1; i < ACC2; i++) s = _mm256_add_epi32(s, a[i]);
    return (float)_mm256_extract_epi32(s, 0);
}

static void run(const char *name, const char *feature, int has, float (*loop)(long), int per_instruction,
                int chains) {
    if (!has) {
        printf("| %s | | | CPU lacks %s |\n", name, feature);
        return;
    }
    loop(ITERS / 20);
    double t0 = cpu_seconds();
    float sink = loop(ITERS);
    double s = cpu_seconds() - t0;
    printf("| %s | %.2f | %.0f | (%g) |\n", name, ITERS * chains / s / 1e9,
           ITERS * chains * per_instruction * 2.0 / s / 1e9, (double)sink);
}

int main(void) {
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f");
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    int bf16 = avx512 && (a & (1u << 5));
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    printf("| instruction (one core) | G instructions/s | GOP/s | |\n| --- | --: | --: | --- |\n");
    run("VFMADD231PS zmm (float32)", "AVX-512", avx512, fma_loop, 16, ACC);
    run("VPDPBUSD zmm (int8)", "AVX512-VNNI", avx512 && __builtin_cpu_supports("avx512vnni"), vnni_loop, 64, ACC);
    run("VDPBF16PS zmm (bfloat16)", "AVX512-BF16", bf16, bf16_loop, 32, ACC);
    run("VFMADD231PS ymm (float32)", "AVX2 and FMA", avx2, fma256_loop, 8, ACC);
    run("AVX2 int8 sequence (32 int8 multiply-adds)", "AVX2", avx2, int8_256_loop, 32, ACC2);
    run("AVX2 q4 sequence (32 multiply-adds, int16 sums)", "AVX2", avx2, q4_256_loop, 32, ACC2);
    return 0;
}
