// fast_linear.c's AVX2 path: a group's lanes are two 8-lane halves (blocks 0-7, 8-15), formed
// by vpmaddubsw + vpmaddwd on q (Q4_1) or |w| and sign-flipped activations (Q8_0; no int16
// overflow: |w| <= 127). Part by part, each row's integer sums stay in one register, so the
// weights of a part are loaded once for every row and nothing spills. A short last group reads
// whole 32-byte vectors past its t blocks (the packer leaves slack after the last feature): those
// lanes meet zero activations and zero scales, and a half with no block is skipped.
#define FAST_ROW_CHUNK 4

static int features_per_call(int64_t rows) {
    (void)rows;
    return 1;
}

static inline void load_scales(const uint8_t* p, int t, __m256 out[2]) {  // t fp16 values, then zeros
    if (t == GB) {
        out[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
        out[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16)));
        return;
    }
    uint16_t h[GB] = {0};
    memcpy(h, p, 2 * t);
    out[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)h));
    out[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + 8)));
}

static inline __m256i dot4(__m256i u, __m256i s) {  // sums of 4 u8 x s8 products a lane
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

static inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

// The integer lanes of half h for NR rows: sums[r] (8 lanes).
static inline __attribute__((always_inline)) void half_sums(const uint8_t* g, int t, int h, const int kind,
                                                           const uint8_t* act, int64_t row_stride, const int NR,
                                                           __m256i sums[FAST_ROW_CHUNK]) {
    for (int r = 0; r < NR; r++) sums[r] = _mm256_setzero_si256();
    if (kind == KIND_Q4_1) {  // q <= 15: a pair's products stay <= 3810, so all 8 parts add up in int16
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        __m256i pairs[FAST_ROW_CHUNK];
        for (int r = 0; r < NR; r++) pairs[r] = _mm256_setzero_si256();
        for (int v = 0; v < 4; v++) {
            __m256i raw = load32(g + 4 * t * v + 32 * h);
            __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            for (int r = 0; r < NR; r++) {
                const uint8_t* a = act + r * row_stride + 32 * h;
                pairs[r] = _mm256_add_epi16(pairs[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, load32(a + 64 * v)),
                                                                       _mm256_maddubs_epi16(hi, load32(a + 64 * (v + 4)))));
            }
        }
        for (int r = 0; r < NR; r++) sums[r] = _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1));
        return;
    }
    for (int v = 0; v < PARTS; v++) {
        __m256i w = _mm256_xor_si256(load32(g + 4 * t * v + 32 * h), _mm256_set1_epi8((char)0x80));
        __m256i magnitude = _mm256_abs_epi8(w);
        for (int r = 0; r < NR; r++) {
            __m256i a = load32(act + r * row_stride + 64 * v + 32 * h);
            sums[r] = _mm256_add_epi32(sums[r], dot4(magnitude, _mm256_sign_epi8(a, w)));
        }
    }
}

static inline float vlane_sum(__m256 lo, __m256 hi) {  // lane_sum's order
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 u = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

static inline __attribute__((always_inline)) void vfeature(const uint8_t* feature, int64_t nb, const int kind,
                                                          const uint8_t* act, const int NR, float* y, int64_t out,
                                                          int64_t o) {
    const int64_t group_bytes = GB * block_bytes(kind), ng = num_groups(nb), row_stride = ng * GROUP_BYTES;
    __m256 acc[FAST_ROW_CHUNK][2];
    for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        int t = nb - g * GB < GB ? (int)(nb - g * GB) : GB;
        const uint8_t* gp = feature + g * group_bytes;
        for (int64_t line = 0; line < group_bytes; line += 64) PREFETCH(gp + PREFETCH_BYTES + line);
        __m256 dw[2], m[2];
        load_scales(gp + (kind == KIND_Q4_1 ? 16 : 32) * t, t, dw);
        if (kind == KIND_Q4_1) load_scales(gp + 18 * t, t, m);
        const uint8_t* a = act + g * GROUP_BYTES;
        for (int h = 0; h < 2 && 8 * h < t; h++) {
            __m256i sums[FAST_ROW_CHUNK];
            half_sums(gp, t, h, kind, a, row_stride, NR, sums);
            for (int r = 0; r < NR; r++) {
                const float* dx = (const float*)(a + r * row_stride + DX_AT) + 8 * h;
                const float* s = (const float*)(a + r * row_stride + S_AT) + 8 * h;
                __m256 sc = _mm256_mul_ps(dw[h], _mm256_loadu_ps(dx));
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), sc, acc[r][h]);
                if (kind == KIND_Q4_1) acc[r][h] = _mm256_fmadd_ps(m[h], _mm256_loadu_ps(s), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < NR; r++) y[r * out + o] = vlane_sum(acc[r][0], acc[r][1]);
}

#define FAST_CASE(KIND, N) \
    case N: vfeature(first, nb, KIND, act, N, y, out, o); return;
#define FAST_SWITCH(KIND) switch (nr) { FAST_CASE(KIND, 1) FAST_CASE(KIND, 2) FAST_CASE(KIND, 3) FAST_CASE(KIND, 4) }

static void fast_features(const uint8_t* first, int64_t stride, int64_t nb, int kind, const uint8_t* act, int nr,
                          float* y, int64_t out, int64_t o, int nf) {
    (void)stride, (void)nf;  // one feature a call
    if (kind == KIND_Q4_1) FAST_SWITCH(KIND_Q4_1) else FAST_SWITCH(KIND_Q8_0)
}
