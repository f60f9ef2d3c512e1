/* ------------------------------------------------------------------------------------ 4-bit products
   A section of _kernels.c (included there after "int8 products", whose quantized inputs it multiplies).

   A q4 weight (FMT_Q4) holds each output's inputs in blocks of QB = 32: 4-bit integers q in -8 .. 7 and
   one float16 scale s per block, w ~ s * q, as llama.cpp's q4_0 (4.5 bits a weight: a batch-1 step,
   bound by reading the weights, reads 0.56 of int8's bytes). The inputs are quantized as for int8
   weights (quantize_row: x ~ d * q8 by blocks of 32), so a block's product is again an exact int32 sum,
   now scaled by both blocks' scales:

       y[m, j] = sum over blocks of (s[j, block] * d[m, block]) * isum[m, j, block]   (+ bias, then gelu)

   one FMA a block, in order, from zero, on every path (fmaf on the portable one): a row gets the same
   bits in any batch and on any path. A block of inputs holding inf or NaN has d = NaN: NaN outputs.

   Layout, per panel of 32 outputs, per block b at b * Q4_BLOCK bytes: 8 groups of 4 inputs, 64 bytes
   each (byte 4 * o + i holds input i of output o in its low nibble and of output 16 + o in its high
   one, as q + 8: 0 .. 15), then the 32 outputs' float16 scales (64 bytes). The nibbles are vpdpbusd's
   unsigned operand as they are (the inputs its signed one); each block's int32 sum starts at
   -8 * sum(q8) to take the 8s back out. Products of many rows run on AMX where it can (q4_panels_amx:
   the same bits). */

#ifndef Q4_AVX2_ROWS
#define Q4_AVX2_ROWS 4 /* the most rows of an AVX2 tile (q4tile256): the nibbles unpacked once for them all */
#endif
#if Q4_AVX2_ROWS < 1 || Q4_AVX2_ROWS > 4
#error "Q4_AVX2_ROWS must be 1 to 4: q4tile256 keeps each row's sums in registers (Q4TILES256 has tiles of 1 to 4)"
#endif

/* Q4_BLOCK (576 bytes: 512 of nibbles, 64 of scales) is defined with panel_elems, in _kernels.c. */

/* The start of block `blk` of panel p of a q4 weight over k inputs. */
static inline const uint8_t *q4_block(const uint16_t *w, int64_t p, int64_t blk, int64_t k) {
    return (const uint8_t *)w + p * panel_elems(k, FMT_Q4) + blk * Q4_BLOCK;
}

/* Input i (0 .. 31) of output j (0 .. 31) of a block, as q + 8 (0 .. 15). */
static inline int q4_nibble(const uint8_t *block, int64_t i, int64_t j) {
    uint8_t byte = block[(i >> 2) * 64 + (j & 15) * 4 + (i & 3)];
    return j < 16 ? byte & 15 : byte >> 4;
}

/* Output j's scale in a block. */
static inline float q4_scale(const uint8_t *block, int64_t j) {
    uint16_t h;
    memcpy(&h, block + QB * PANEL / 2 + 2 * j, 2);
    return f16_to_f32(h);
}

/* The float32 value of input i of output j of panel p: s * q. */
static inline float q4_at(const uint16_t *w, int64_t p, int64_t i, int64_t j, int64_t k) {
    const uint8_t *block = q4_block(w, p, i / QB, k);
    return (float)(q4_nibble(block, i % QB, j) - 8) * q4_scale(block, j);
}

/* Portable C: rows of the quantized x (q [rows][kp], d [rows][kb]) times panels p0 .. p1 - 1 into y. */
static void q4_portable(const int8_t *q, const float *d, int64_t rows, int64_t k, const uint16_t *w, int64_t p0,
                        int64_t p1, float *y, int64_t n) {
    int64_t kp = kpad(k), kb = kp / QB;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < PANEL && p * PANEL + j < n; j++) {
                float acc = 0.0f;
                for (int64_t blk = 0; blk < kb; blk++) {
                    const uint8_t *block = q4_block(w, p, blk, k);
                    const int8_t *qr = q + r * kp + blk * QB;
                    int32_t s = 0;
                    for (int64_t i = 0; i < QB; i++) s += (q4_nibble(block, i, j) - 8) * qr[i];
                    acc = fmaf((float)s, q4_scale(block, j) * d[r * kb + blk], acc);
                }
                y[r * n + p * PANEL + j] = acc;
            }
}

#if HAVE_X86
/* The sums of a tile: `mr` rows times `np` whole panels from w (gs bytes a panel), with the int8 tiles'
   operands (xg: the rows' 4-input groups as int32, [group][mr]; dd, cc: [block][mr], cc = -8 * sum(q8)).
   Vector v is half v % 2 of panel v / 2: the low nibbles are outputs 0 .. 15, the high ones 16 .. 31. */
X512V static INLINE void q4tile512(const int32_t *xg, const float *dd, const int32_t *cc, int64_t kb,
                                   const uint8_t *w, int64_t gs, const int mr, const int np, float *y, int64_t n,
                                   int64_t col0) {
    __m512 fa[6][8], sv[8];
    __m512i ia[6][8], wv[8];
    const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * np; v++) fa[r][v] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < kb; blk++) {
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m512i c = _mm512_set1_epi32(cc[blk * mr + r]);
#pragma GCC unroll 8
            for (int v = 0; v < 2 * np; v++) ia[r][v] = c;
        }
#pragma GCC unroll 8
        for (int g = 0; g < QB / 4; g++) {
            int64_t gi = blk * (QB / 4) + g;
#pragma GCC unroll 4
            for (int pp = 0; pp < np; pp++) {
                const uint8_t *src = w + pp * gs + blk * Q4_BLOCK + g * 64;
                if (mr < 4) _mm_prefetch((const char *)src + 2 * PREFETCH, _MM_HINT_T0);
                __m512i raw = _mm512_loadu_si512((const void *)src);
                wv[2 * pp] = _mm512_and_si512(raw, low);
                wv[2 * pp + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            }
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++) {
                __m512i xb = _mm512_set1_epi32(xg[gi * mr + r]);
#pragma GCC unroll 8
                for (int v = 0; v < 2 * np; v++) ia[r][v] = _mm512_dpbusd_epi32(ia[r][v], wv[v], xb);
            }
        }
#pragma GCC unroll 4
        for (int pp = 0; pp < np; pp++) {
            const uint8_t *sp = w + pp * gs + blk * Q4_BLOCK + QB * PANEL / 2;
            sv[2 * pp] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sp));
            sv[2 * pp + 1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + 32)));
        }
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m512 db = _mm512_set1_ps(dd[blk * mr + r]);
#pragma GCC unroll 8
            for (int v = 0; v < 2 * np; v++)
                fa[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r][v]), _mm512_mul_ps(sv[v], db), fa[r][v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < 2 * np; v++) {
            int64_t col = col0 + (v / 2) * PANEL + (v % 2) * 16;
            if (col >= n) continue;
            __mmask16 keep = n - col >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - col)) - 1);
            _mm512_mask_storeu_ps(y + r * n + col, keep, fa[r][v]);
        }
}

#define ARGSQ4 const int32_t *xg, const float *dd, const int32_t *cc, int64_t kb, const uint8_t *w, int64_t gs, \
               float *y, int64_t n, int64_t col0
typedef void (*q4_fn)(ARGSQ4);
#define Q4T512(MR, NP) \
    X512V static void q4t512_##MR##_##NP(ARGSQ4) { q4tile512(xg, dd, cc, kb, w, gs, MR, NP, y, n, col0); }
Q4T512(1, 1) Q4T512(1, 2) Q4T512(1, 3) Q4T512(1, 4) Q4T512(2, 1) Q4T512(2, 2) Q4T512(3, 1) Q4T512(3, 2)
Q4T512(4, 1) Q4T512(5, 1) Q4T512(6, 1)
/* [rows][panels]: one row up to 4 panels at once (memory streams), two or three rows 2, more 1. */
static const q4_fn Q4TILES[7][5] = {{NULL}, {NULL, q4t512_1_1, q4t512_1_2, q4t512_1_3, q4t512_1_4},
                                    {NULL, q4t512_2_1, q4t512_2_2}, {NULL, q4t512_3_1, q4t512_3_2},
                                    {NULL, q4t512_4_1}, {NULL, q4t512_5_1}, {NULL, q4t512_6_1}};

/* AVX2 (no VNNI): one row, one panel, as four vectors of 8 outputs. vpmaddubsw multiplies the unsigned
   nibbles by the signed inputs (pairs at most 2 * 15 * 127 = 3810: no saturation), and a block's eight
   groups add up in int16 (at most 8 * 3810 = 30480 < 32767: exact) before one vpmaddwd by ones sums
   them to int32: the same exact sums as vpdpbusd, with one vpmaddwd a block where there was one a group
   (the multiplies are what bounds this loop). Bytes 0 .. 31 of a group are outputs 0 .. 7 (low nibbles)
   and 16 .. 23 (high), bytes 32 .. 63 outputs 8 .. 15 and 24 .. 31. */
X86 static void q4row256(const int32_t *xg, const float *dd, const int32_t *cc, int64_t kb, const uint8_t *w,
                         float *y, int64_t n, int64_t col0) {
    __m256 fa[4];
    __m256i ia[4], wv[4];
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int v = 0; v < 4; v++) fa[v] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < kb; blk++) {
        for (int v = 0; v < 4; v++) ia[v] = _mm256_setzero_si256();  /* int16 pair sums until the block ends */
        /* (a group at a time: unrolled, GCC regrouped the exact integer sums of all 8 groups and spilled
           the partial sums to the stack) */
#pragma GCC unroll 1
        for (int g = 0; g < QB / 4; g++) {
            const uint8_t *src = w + blk * Q4_BLOCK + g * 64;
            __m256i r0 = _mm256_loadu_si256((const __m256i *)src), r1 = _mm256_loadu_si256((const __m256i *)(src + 32));
            wv[0] = _mm256_and_si256(r0, low);
            wv[1] = _mm256_and_si256(r1, low);
            wv[2] = _mm256_and_si256(_mm256_srli_epi16(r0, 4), low);
            wv[3] = _mm256_and_si256(_mm256_srli_epi16(r1, 4), low);
            __m256i xb = _mm256_set1_epi32(xg[blk * (QB / 4) + g]);
            for (int v = 0; v < 4; v++) ia[v] = _mm256_add_epi16(ia[v], _mm256_maddubs_epi16(wv[v], xb));
        }
        for (int v = 0; v < 4; v++)
            ia[v] = _mm256_add_epi32(_mm256_madd_epi16(ia[v], ones), _mm256_set1_epi32(cc[blk]));
        const uint8_t *sp = w + blk * Q4_BLOCK + QB * PANEL / 2;
        __m256 db = _mm256_set1_ps(dd[blk]);
        for (int v = 0; v < 4; v++) {
            __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 16 * v)));
            fa[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[v]), _mm256_mul_ps(s, db), fa[v]);
        }
    }
    for (int v = 0; v < 4; v++) {
        int64_t col = col0 + 8 * v;
        float t[8];
        _mm256_storeu_ps(t, fa[v]);
        for (int64_t j = 0; j < 8 && col + j < n; j++) y[col + j] = t[j];
    }
}

/* AVX2, `mr` rows (2 to 4) at once, half `hp` of one panel: bytes hp * 32 .. hp * 32 + 31 of each group,
   outputs 8 hp .. 8 hp + 7 (low nibbles) and 16 + 8 hp .. (high), unpacked once for all the rows. Each
   row's arithmetic is q4row256's, in the same order: the same bits. xg, dd, cc: the tile's, input-major
   ([group][mr], [block][mr]). */
X86 static INLINE void q4tile256(const int32_t *xg, const float *dd, const int32_t *cc, int64_t kb, const uint8_t *w,
                                 const int mr, const int hp, float *y, int64_t n, int64_t col0) {
    __m256 fa[4][2];
    __m256i h[4][2];
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) fa[r][0] = fa[r][1] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < kb; blk++) {
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) h[r][0] = h[r][1] = _mm256_setzero_si256();
        /* (a group at a time: unrolled, GCC regrouped the exact integer sums of all 8 groups and spilled
           the partial sums to the stack) */
#pragma GCC unroll 1
        for (int g = 0; g < QB / 4; g++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(w + blk * Q4_BLOCK + g * 64 + hp * 32));
            __m256i w0 = _mm256_and_si256(raw, low), w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++) {
                __m256i xb = _mm256_set1_epi32(xg[(blk * (QB / 4) + g) * mr + r]);
                h[r][0] = _mm256_add_epi16(h[r][0], _mm256_maddubs_epi16(w0, xb));
                h[r][1] = _mm256_add_epi16(h[r][1], _mm256_maddubs_epi16(w1, xb));
            }
        }
        const uint8_t *sp = w + blk * Q4_BLOCK + QB * PANEL / 2;
        __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 16 * hp)));
        __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 16 * (hp + 2))));
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            __m256 db = _mm256_set1_ps(dd[blk * mr + r]);
            __m256i c = _mm256_set1_epi32(cc[blk * mr + r]);
            fa[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(h[r][0], ones), c)),
                                       _mm256_mul_ps(s0, db), fa[r][0]);
            fa[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(h[r][1], ones), c)),
                                       _mm256_mul_ps(s1, db), fa[r][1]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < 2; v++) {
            int64_t col = col0 + 16 * v + 8 * hp;
            float t[8];
            _mm256_storeu_ps(t, fa[r][v]);
            for (int64_t j = 0; j < 8 && col + j < n; j++) y[r * n + col + j] = t[j];
        }
}

#define Q4T256(MR) \
    X86 static void q4t256_##MR(ARGSQ4) { (void)gs; \
        q4tile256(xg, dd, cc, kb, w, MR, 0, y, n, col0); q4tile256(xg, dd, cc, kb, w, MR, 1, y, n, col0); }
Q4T256(2) Q4T256(3) Q4T256(4)
static const q4_fn Q4TILES256[5] = {NULL, NULL, q4t256_2, q4t256_3, q4t256_4};

/* Panels p0 .. p1 - 1 of the sums for the packed tiles of the quantized rows (as q8_panels_x86; tiles
   from q4_plan). */
static void q4_panels_x86(int simd, const int32_t *xg, const float *dd, const int32_t *cc, int64_t m, int64_t k,
                          const uint16_t *w, int64_t p0, int64_t p1, float *y, int64_t n, const int64_t *sizes,
                          int64_t tiles) {
    int64_t kb = kpad(k) / QB, groups = kpad(k) / 4, gs = panel_elems(k, FMT_Q4);
    const uint8_t *w8 = (const uint8_t *)w;
    if (simd == PATH_AVX512 && m <= 3) {
        int64_t most = m == 1 ? 4 : 2;
        for (int64_t p = p0; p < p1;) {
            int64_t g = min64(most, p1 - p);
            Q4TILES[m][g](xg, dd, cc, kb, w8 + p * gs, gs, y, n, p * PANEL);
            p += g;
        }
        return;
    }
    for (int64_t p = p0; p < p1; p++)
        for (int64_t t = 0, r0 = 0; t < tiles; r0 += sizes[t], t++) {
            const int32_t *xt = xg + r0 * groups, *ct = cc + r0 * kb;
            const float *dt = dd + r0 * kb;
            if (simd == PATH_AVX512) Q4TILES[sizes[t]][1](xt, dt, ct, kb, w8 + p * gs, gs, y + r0 * n, n, p * PANEL);
            else if (sizes[t] > 1) Q4TILES256[sizes[t]](xt, dt, ct, kb, w8 + p * gs, gs, y + r0 * n, n, p * PANEL);
            else q4row256(xt, dt, ct, kb, w8 + p * gs, y + r0 * n, n, p * PANEL);
        }
}
#endif

/* How the q4 path `simd` splits m rows into tiles (as q8_plan): AVX-512 up to 3 rows in one tile, more in
   balanced tiles of up to 6; AVX2 balanced tiles of up to Q4_AVX2_ROWS; portable one tile. */
static int64_t q4_plan(int simd, int64_t m, int64_t *sizes) {
    int64_t most = simd == PATH_AVX512 ? (m <= 3 ? 3 : 6) : simd == PATH_AVX2 ? Q4_AVX2_ROWS : m;
    int64_t tiles = (m + most - 1) / most;
    for (int64_t t = 0; t < tiles; t++) sizes[t] = m / tiles + (t < m % tiles);
    return tiles;
}

#if HAVE_AMX
/* q4 on AMX, for products of many rows (as int8's, amx_rows): a task's panels are unpacked once into int8
   panels (q in -8 .. 7, int8's layout, so that amx16's B tiles read them), then one TDPBSSD a block of
   32 inputs gives the block's exact int32 sums (the VNNI path's, without its + 8 offset), scaled as
   q4tile512 scales them lane for lane: acc = fma(float(sum), s * d, acc), over the blocks in order. */

/* Panel p of a q4 weight over k inputs → an int8 panel's kpad(k) / 4 groups of [32 outputs][4] at dst:
   a block's group g (64 bytes) holds outputs 0 .. 15 in its low nibbles and 16 .. 31 in its high ones. */
XAMX static void q4_unpack_panel(const uint16_t *w, int64_t p, int64_t k, int8_t *dst) {
    const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    for (int64_t blk = 0; blk < kpad(k) / QB; blk++) {
        const uint8_t *b = q4_block(w, p, blk, k);
        for (int g = 0; g < QB / 4; g++) {
            __m512i raw = _mm512_loadu_si512((const void *)(b + g * 64));
            int8_t *o = dst + (blk * (QB / 4) + g) * 4 * PANEL;
            _mm512_storeu_si512((void *)o, _mm512_sub_epi8(_mm512_and_si512(raw, low), eight));
            _mm512_storeu_si512((void *)(o + 64),
                                _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(raw, 4), low), eight));
        }
    }
}

/* Panels p0 .. p1 - 1 (at most TASK) of a q4 product on AMX, as q8_panels_amx (q, d: its operands), the
   panels unpacked into buf (TASK * kpad(k) * PANEL bytes). */
XAMX static void q4_panels_amx(const int8_t *q, const float *d, int64_t m, int64_t k, const uint16_t *w, int64_t p0,
                               int64_t p1, float *y, int64_t n, int8_t *buf) {
    int64_t size = kpad(k) * PANEL;
    for (int64_t p = p0; p < p1; p++) q4_unpack_panel(w, p, k, buf + (p - p0) * size);
    amx_panels(q, d, m, k, buf, size, w, p0, p1, y, n);
}
#endif
