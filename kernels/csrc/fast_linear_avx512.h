// fast_linear.c's AVX-512 path: a tile's 16 features are one 16-lane vector. VNNI's vpdpbusd forms
// the lanes where the CPU has it (Q8_0 as w + 128, corrected by the activations' corr); elsewhere
// vpmaddubsw + vpmaddwd on |w| and sign-flipped activations (no int16 overflow: |w| <= 127).
#define FAST_ROW_CHUNK 16  // rows whose accumulators stay in registers (16 beside a block's 10 weight vectors)

typedef struct {
    __m512i u[8];       // part v: the unsigned operand (Q4_1 q; Q8_0 w + 128 (VNNI) or |w|) of elements 4v..4v+3
    __mmask64 neg[8];   // Q8_0 without VNNI: where w < 0 (the activation's sign flips)
    __m512 dw, m;       // lane f: feature f's d and m
} WBlock;

static inline __attribute__((always_inline)) void load_wblock(const uint8_t* w, const int kind, WBlock* t) {
    if (kind == KIND_Q4_1) {
        const __m512i low4 = _mm512_set1_epi8(0x0f);
        for (int p = 0; p < 4; p++) {
            __m512i raw = _mm512_loadu_si512(w + 64 * p);
            t->u[p] = _mm512_and_si512(raw, low4);
            t->u[p + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
        t->dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w + 256)));
        t->m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w + 288)));
        return;
    }
    for (int v = 0; v < 8; v++) {
        t->u[v] = _mm512_loadu_si512(w + 64 * v);
#if !defined(__AVX512VNNI__)
        __m512i signed_w = _mm512_xor_si512(t->u[v], _mm512_set1_epi8((char)0x80));
        t->neg[v] = _mm512_movepi8_mask(signed_w);
        t->u[v] = _mm512_abs_epi8(signed_w);
#endif
    }
    t->dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w + 512)));
    t->m = _mm512_setzero_ps();
}

static inline __m512i dot4(__m512i acc, __m512i u, __m512i s) {  // acc + sums of 4 u8 x s8 products
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

// acc after one row's block a: the header's lane arithmetic.
static inline __attribute__((always_inline)) __m512 row_block(const WBlock* t, const uint8_t* a, const int kind,
                                                             __m512 acc) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();  // two chains: dot4's latency
#if defined(__AVX512VNNI__)
    if (kind == KIND_Q8_0) even = _mm512_set1_epi32(act_word(a, CORR_AT / 4));
#endif
    for (int v = 0; v < 8; v += 2) {
        __m512i a0 = _mm512_set1_epi32(act_word(a, v)), a1 = _mm512_set1_epi32(act_word(a, v + 1));
#if !defined(__AVX512VNNI__)
        if (kind == KIND_Q8_0) {
            a0 = _mm512_mask_sub_epi8(a0, t->neg[v], _mm512_setzero_si512(), a0);
            a1 = _mm512_mask_sub_epi8(a1, t->neg[v + 1], _mm512_setzero_si512(), a1);
        }
#endif
        even = dot4(even, t->u[v], a0);
        odd = dot4(odd, t->u[v + 1], a1);
    }
    __m512 dots = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
    acc = _mm512_fmadd_ps(dots, _mm512_mul_ps(t->dw, _mm512_set1_ps(act_float(a, DX_AT))), acc);
    if (kind == KIND_Q4_1) acc = _mm512_fmadd_ps(t->m, _mm512_set1_ps(act_float(a, S_AT)), acc);
    return acc;
}

// y[r, o .. o + 16) (those below `out`) for NR rows of the tile at `tile` (`pairs`: NR / 2 rows, each
// the sum of two activation rows' lanes). One tile a call: two tiles' 20 weight vectors beside the
// rows' accumulators measured slower, even at one row.
static inline __attribute__((always_inline)) void vtile(const uint8_t* tile, int64_t nb, const int kind,
                                                       const uint8_t* act, const int NR, float* y, int64_t out,
                                                       int64_t o, int pairs) {
    const int64_t tb = tile_block_bytes(kind);
    __m512 acc[FAST_ROW_CHUNK];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* w = tile + b * tb;
        for (int64_t line = 0; line < tb; line += 64) PREFETCH(w + PREFETCH_BYTES + line);
        WBlock wb;
        load_wblock(w, kind, &wb);
        for (int r = 0; r < NR; r++) acc[r] = row_block(&wb, act + (r * nb + b) * ACT_BYTES, kind, acc[r]);
    }
    __mmask16 valid = out - o >= TILE ? 0xffff : (__mmask16)((1u << (out - o)) - 1);
    if (pairs)
        for (int r = 0; r + 1 < NR; r += 2) _mm512_mask_storeu_ps(y + r / 2 * out + o, valid, _mm512_add_ps(acc[r], acc[r + 1]));
    else
        for (int r = 0; r < NR; r++) _mm512_mask_storeu_ps(y + r * out + o, valid, acc[r]);
}

#define FAST_CASE(KIND, N) \
    case N: vtile(tile, nb, KIND, act, N, y, out, o, pairs); return;
#define FAST_SWITCH(KIND)                                                                 \
    switch (nr) {                                                                         \
        FAST_CASE(KIND, 1) FAST_CASE(KIND, 2) FAST_CASE(KIND, 3) FAST_CASE(KIND, 4)       \
        FAST_CASE(KIND, 5) FAST_CASE(KIND, 6) FAST_CASE(KIND, 7) FAST_CASE(KIND, 8)       \
        FAST_CASE(KIND, 9) FAST_CASE(KIND, 10) FAST_CASE(KIND, 11) FAST_CASE(KIND, 12)    \
        FAST_CASE(KIND, 13) FAST_CASE(KIND, 14) FAST_CASE(KIND, 15) FAST_CASE(KIND, 16)   \
    }

static void fast_tile(const uint8_t* tile, int64_t nb, int kind, const uint8_t* act, int nr, float* y, int64_t out,
                      int64_t o, int pairs) {
    if (kind == KIND_Q4_1) FAST_SWITCH(KIND_Q4_1) else FAST_SWITCH(KIND_Q8_0)
}
