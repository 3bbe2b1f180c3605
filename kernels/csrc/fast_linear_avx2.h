// fast_linear.c's AVX2 path: a tile's lanes are two 8-lane halves (features 0-7, 8-15), formed by
// vpmaddubsw + vpmaddwd on q (Q4_1) or |w| and sign-flipped activations (Q8_0; no int16 overflow:
// |w| <= 127). Half after half, block after block: each row's integer sums stay in one register,
// so a part's weights are loaded once for every row. The part loops stay rolled: unrolled, GCC 12
// (-march=znver3) loaded every part's weights first and spilled the rows' sums to the stack.
#define FAST_ROW_CHUNK 4

static inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

// The integer lanes of half h of a tile's block w for NR rows' blocks (a, `row_stride` apart).
static inline __attribute__((always_inline)) void half_sums(const uint8_t* w, int h, const int kind, const uint8_t* a,
                                                           int64_t row_stride, const int NR, __m256i sums[FAST_ROW_CHUNK]) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (kind == KIND_Q4_1) {  // q <= 15: a pair's products stay <= 3810, so all 8 parts add up in int16
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        __m256i pairs[FAST_ROW_CHUNK];
        for (int r = 0; r < NR; r++) pairs[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int p = 0; p < 4; p++) {
            __m256i raw = load32(w + 64 * p + 32 * h);
            __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            for (int r = 0; r < NR; r++) {
                const uint8_t* ar = a + r * row_stride;
                __m256i lo_dot = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(act_word(ar, p)));
                __m256i hi_dot = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(act_word(ar, p + 4)));
                pairs[r] = _mm256_add_epi16(pairs[r], _mm256_add_epi16(lo_dot, hi_dot));
            }
        }
        for (int r = 0; r < NR; r++) sums[r] = _mm256_madd_epi16(pairs[r], ones);
        return;
    }
    for (int r = 0; r < NR; r++) sums[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int v = 0; v < 8; v++) {
        __m256i signed_w = _mm256_xor_si256(load32(w + 64 * v + 32 * h), _mm256_set1_epi8((char)0x80));
        __m256i magnitude = _mm256_abs_epi8(signed_w);
        for (int r = 0; r < NR; r++) {
            __m256i s = _mm256_sign_epi8(_mm256_set1_epi32(act_word(a + r * row_stride, v)), signed_w);
            sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, s), ones));
        }
    }
}

static inline __attribute__((always_inline)) void vtile(const uint8_t* tile, int64_t nb, const int kind,
                                                       const uint8_t* act, const int NR, float* y, int64_t out,
                                                       int64_t o, int pairs) {
    const int64_t tb = tile_block_bytes(kind), row_stride = nb * ACT_BYTES;
    for (int h = 0; h < 2 && o + 8 * h < out; h++) {  // a padded last tile may have no second half
        __m256 acc[FAST_ROW_CHUNK];
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* w = tile + b * tb;
            if (h == 0)
                for (int64_t line = 0; line < tb; line += 64) PREFETCH(w + PREFETCH_BYTES + line);
            const uint8_t* scales = w + scales_at(kind) + 16 * h;
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)scales));
            __m256 m = kind == KIND_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(scales + 2 * TILE)))
                                         : _mm256_setzero_ps();
            __m256i sums[FAST_ROW_CHUNK];
            const uint8_t* a = act + b * ACT_BYTES;
            half_sums(w, h, kind, a, row_stride, NR, sums);
            for (int r = 0; r < NR; r++) {
                const uint8_t* ar = a + r * row_stride;
                __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(act_float(ar, DX_AT)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), sc, acc[r]);
                if (kind == KIND_Q4_1) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(act_float(ar, S_AT)), acc[r]);
            }
        }
        int64_t f0 = o + 8 * h;
        for (int r = 0; r < NR; r += 1 + pairs) {  // pairs: row r / 2 is the sum of rows r and r + 1
            __m256 v = pairs ? _mm256_add_ps(acc[r], acc[r + 1]) : acc[r];
            float* yr = y + (pairs ? r / 2 : r) * out + f0;
            if (out - f0 >= 8) {
                _mm256_storeu_ps(yr, v);
                continue;
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, v);
            for (int f = 0; f < out - f0; f++) yr[f] = lanes[f];
        }
    }
}

#define FAST_CASE(KIND, N) \
    case N: vtile(tile, nb, KIND, act, N, y, out, o, pairs); return;
#define FAST_SWITCH(KIND) switch (nr) { FAST_CASE(KIND, 1) FAST_CASE(KIND, 2) FAST_CASE(KIND, 3) FAST_CASE(KIND, 4) }

static void fast_tile(const uint8_t* tile, int64_t nb, int kind, const uint8_t* act, int nr, float* y, int64_t out,
                      int64_t o, int pairs) {
    if (kind == KIND_Q4_1) FAST_SWITCH(KIND_Q4_1) else FAST_SWITCH(KIND_Q8_0)
}
