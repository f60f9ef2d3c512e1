/* How fast does a decode step's attention read a float16 KV cache, by the cache's layout?

   A decode row attends, head by head, over the keys and then the values of its slot: each head's `keys`
   positions are one run of keys x d x 2 bytes, and in inferno's slots ([heads, n_positions, d] a layer)
   the next head's run starts n_positions x d x 2 bytes further on, however few positions are in use.
   This times that read (the same loads, float16 widening, dot products and weighted sums as the half
   plugin's attend_512, one thread, 16 rows x 12 heads x 12 layers of GPT-2 small) for a slot length L
   from `keys` (the runs back to back) up to 1024, with and without transparent huge pages; and for the
   other order of a slot, positions-major ([n_positions, heads, d]), read head by head as the kernels do
   (a key every heads x d x 2 bytes); and heads-major slots read with the kernels' software prefetching
   (prefetch_row: a head's values while its scores run, the next head's keys and values a pass ahead).
   The caches are far bigger than the CPU's caches, and 64 MB is written between rounds.

   Build and run (x86-64 with AVX-512):
       cc -O3 -march=x86-64-v4 benches/kv_cache_reads.c -o /tmp/kv_cache_reads
       /tmp/kv_cache_reads 128            # keys; prints a row per L and huge-page setting
*/
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define D 64
#define HEADS (16 * 12 * 12) /* rows x heads x layers */

/* The row j of a run into the cache, as the half plugin's prefetch_row (none if p is NULL). Always
   inlined: GCC drops a call to a function that only prefetches. */
__attribute__((always_inline)) static inline void prefetch_row(const uint16_t *p, int64_t j, int64_t ks) {
    if (!p) return;
    for (int b = 0; b < D * 2; b += 64) _mm_prefetch((const char *)(p + j * ks) + b, _MM_HINT_T0);
}

/* One query over `keys` keys and values of one head (key j at k + j * ks), as attend_512 (d = 64, float16 caches); a cheap
   stand-in for exp keeps the arithmetic from hiding the reads. nk, nv: the next head's run, prefetched as
   attend_512 does (NULL: no prefetching). */
__attribute__((noinline)) static float attend(const float *q, const uint16_t *k, const uint16_t *v, int64_t keys,
                                              float *s, float *o, int64_t ks, const uint16_t *nk,
                                              const uint16_t *nv) {
    __m512 qv[4], acc[4];
    for (int c = 0; c < 4; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < keys; j++) {
        const uint16_t *kj = k + j * ks;
        if (nk) prefetch_row(v, j, ks);
        prefetch_row(nk, j, ks);
        __m512 a = _mm512_mul_ps(qv[0], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kj)));
        for (int c = 1; c < 4; c++)
            a = _mm512_fmadd_ps(qv[c], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kj + 16 * c))), a);
        s[j] = _mm512_reduce_add_ps(a) * 0.125f;
        m = s[j] > m ? s[j] : m;
    }
    for (int64_t j = 0; j < keys; j++) { s[j] = (s[j] - m) * 0.01f + 1.0f; sum += s[j]; }
    for (int c = 0; c < 4; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < keys; j++) {
        __m512 p = _mm512_set1_ps(s[j]);
        prefetch_row(nv, j, ks);
        for (int c = 0; c < 4; c++)
            acc[c] = _mm512_fmadd_ps(p, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + j * ks + 16 * c))),
                                     acc[c]);
    }
    for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
    return sum;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void run(int64_t keys, int64_t l, int huge, int positions_major, int prefetch) {
    size_t bytes = (size_t)HEADS * l * D * 2, align = 1 << 21;
    bytes = (bytes + align - 1) / align * align;
    uint16_t *k = aligned_alloc(align, bytes), *v = aligned_alloc(align, bytes);
    char *flush = malloc(64 << 20);
    if (!k || !v || !flush) { fprintf(stderr, "out of memory\n"); exit(1); }
    madvise(k, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    madvise(v, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (size_t i = 0; i < bytes / 2; i++) { k[i] = 0x3400 + i % 7; v[i] = 0x3400 + i % 5; }
    float q[D], o[D], *s = malloc(sizeof(float) * keys), total = 0.0f, best = INFINITY;
    for (int i = 0; i < D; i++) q[i] = 0.01f * i;
    for (int round = 0; round < 7; round++) {
        memset(flush, round, 64 << 20);
        double t0 = now();
        if (positions_major)  /* HEADS / 12 slot-layers of [l][12][D], each read head by head */
            for (int64_t sl = 0; sl < HEADS / 12; sl++)
                for (int64_t h = 0; h < 12; h++)
                    total += attend(q, k + (sl * l * 12 + h) * D, v + (sl * l * 12 + h) * D, keys, s, o, 12 * D,
                                    NULL, NULL);
        else
            for (int64_t h = 0; h < HEADS; h++) {
                int next = prefetch && h + 1 < HEADS;
                total += attend(q, k + h * l * D, v + h * l * D, keys, s, o, D, next ? k + (h + 1) * l * D : NULL,
                                next ? v + (h + 1) * l * D : NULL);
            }
        double t = now() - t0;
        if (t < best) best = (float)t;
    }
    double mb = (double)HEADS * keys * D * 2 * 2 / 1e6;
    printf("| %s%s | %ld | %ld | %s | %.2f | %.1f |\n", positions_major ? "positions-major" : "heads-major",
           prefetch ? ", prefetched" : "",
           (long)keys, (long)l, huge ? "yes" : "no", best * 1e3,
           mb / 1e3 / best);
    if (total == 0.0f) printf("(unreachable)\n");
    free(k); free(v); free(flush); free(s);
}

int main(int argc, char **argv) {
    int64_t keys = argc > 1 ? atoll(argv[1]) : 128;
    if (keys < 1 || keys > 1024) { fprintf(stderr, "keys: 1..1024\n"); return 2; }
    printf("| slot | keys | slot length L | huge pages | ms (best of 7) | GB/s |\n"
           "| --- | --: | --: | --- | --: | --: |\n");
    int64_t lengths[] = {keys, keys + keys / 4, 2 * keys, 1024};
    for (int i = 0; i < 4; i++) {
        if (lengths[i] > 1024 || (i && lengths[i] <= lengths[i - 1])) continue;
        for (int huge = 0; huge < 2; huge++) run(keys, lengths[i], huge, 0, 0);
    }
    for (int huge = 0; huge < 2; huge++) run(keys, 1024, huge, 1, 0);
    run(keys, keys, 0, 0, 1);
    run(keys, 1024, 0, 0, 1);
    return 0;
}
