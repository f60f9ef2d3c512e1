/* The peak multiply-add rate of one core's vector dot-product instructions (#44): which one the compute-bound
   products and attention should run on, on this CPU. Each is a loop of 12 independent accumulators (so
   the instruction's throughput, not its latency, bounds it), timed in thread CPU time:

     FMA          VFMADD231PS zmm: 16 float32 multiply-adds (the 16-bit formats' products, float32 attention)
     VNNI         VPDPBUSD zmm: 64 int8 x uint8 multiply-adds into int32 (int8 and q4 products)
     AVX512-BF16  VDPBF16PS zmm: 32 bfloat16 multiply-adds into float32 (attention=bfloat16 without AMX)

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

static void run(const char *name, const char *feature, int has, float (*loop)(long), int per_instruction) {
    if (!has) {
        printf("| %s | | | CPU lacks %s |\n", name, feature);
        return;
    }
    loop(ITERS / 20);
    double t0 = cpu_seconds();
    float sink = loop(ITERS);
    double s = cpu_seconds() - t0;
    printf("| %s | %.2f | %.0f | (%g) |\n", name, ITERS * ACC / s / 1e9, ITERS * ACC * per_instruction * 2.0 / s / 1e9,
           (double)sink);
}

int main(void) {
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f");
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    int bf16 = avx512 && (a & (1u << 5));
    printf("| instruction (zmm, one core) | G instructions/s | GOP/s | |\n| --- | --: | --: | --- |\n");
    run("VFMADD231PS (float32)", "AVX-512", avx512, fma_loop, 16);
    run("VPDPBUSD (int8)", "AVX512-VNNI", avx512 && __builtin_cpu_supports("avx512vnni"), vnni_loop, 64);
    run("VDPBF16PS (bfloat16)", "AVX512-BF16", bf16, bf16_loop, 32);
    return 0;
}
