// fast_linear.c's AVX2 path: a group's parts are two 8-lane halves (blocks 0-7, 8-15);
// vpmaddubsw + vpmaddwd form the lanes on q (Q4_1) or |w| and sign-flipped activations (Q8_0; no
// int16 overflow: |w| <= 127). A short last group is copied into a zero-padded full one first.
#define FAST_ROW_CHUNK 4

static int features_per_call(int64_t rows) {
    (void)rows;
    return 1;
}

#define FULL_GROUP_BYTES (GB * 34)

// A group of t < 16 blocks rewritten as a full group whose missing blocks are zeros.
static void pad_group(const uint8_t* g, int t, int kind, uint8_t* full) {
    int parts = kind == KIND_Q4_1 ? 4 : PARTS, scales = kind == KIND_Q4_1 ? 2 : 1;
    memset(full, 0, FULL_GROUP_BYTES);
    for (int v = 0; v < parts; v++) memcpy(full + 64 * v, g + 4 * t * v, 4 * t);
    for (int k = 0; k < scales; k++) memcpy(full + 64 * parts + 32 * k, g + 4 * t * parts + 2 * t * k, 2 * t);
}

typedef struct {
    __m256i u[PARTS];  // the unsigned operand: Q4_1 q; Q8_0 w (signed: its sign goes to the activation)
    __m256 dw, m;
} VHalf;

static inline __attribute__((always_inline)) void vhalf(const uint8_t* g, int h, const int kind, VHalf* w) {
    if (kind == KIND_Q4_1) {
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        for (int v = 0; v < 4; v++) {
            __m256i raw = _mm256_loadu_si256((const __m256i*)(g + 64 * v + 32 * h));
            w->u[v] = _mm256_and_si256(raw, low4);
            w->u[v + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        }
        w->dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(g + 256 + 16 * h)));
        w->m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(g + 288 + 16 * h)));
        return;
    }
    for (int v = 0; v < PARTS; v++)
        w->u[v] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(g + 64 * v + 32 * h)),
                                   _mm256_set1_epi8((char)0x80));
    w->dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(g + 512 + 16 * h)));
    w->m = _mm256_setzero_ps();
}

static inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

static inline __attribute__((always_inline)) __m256 vrow(const VHalf* w, const uint8_t* act, int h,
                                                        const int kind, __m256 acc) {
    __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
    for (int v = 0; v < PARTS; v += 2) {
        __m256i a0 = _mm256_loadu_si256((const __m256i*)(act + 64 * v + 32 * h));
        __m256i a1 = _mm256_loadu_si256((const __m256i*)(act + 64 * (v + 1) + 32 * h));
        if (kind == KIND_Q4_1) {
            even = dot4(even, w->u[v], a0);
            odd = dot4(odd, w->u[v + 1], a1);
        } else {
            even = dot4(even, _mm256_abs_epi8(w->u[v]), _mm256_sign_epi8(a0, w->u[v]));
            odd = dot4(odd, _mm256_abs_epi8(w->u[v + 1]), _mm256_sign_epi8(a1, w->u[v + 1]));
        }
    }
    __m256 dots = _mm256_cvtepi32_ps(_mm256_add_epi32(even, odd));
    const float *dx = (const float*)(act + DX_AT) + 8 * h, *s = (const float*)(act + S_AT) + 8 * h;
    acc = _mm256_fmadd_ps(dots, _mm256_mul_ps(w->dw, _mm256_loadu_ps(dx)), acc);
    if (kind == KIND_Q4_1) acc = _mm256_fmadd_ps(w->m, _mm256_loadu_ps(s), acc);
    return acc;
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
    const int64_t group_bytes = GB * block_bytes(kind), ng = num_groups(nb);
    __m256 acc[FAST_ROW_CHUNK][2];
    for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        int t = nb - g * GB < GB ? (int)(nb - g * GB) : GB;
        const uint8_t* gp = feature + g * group_bytes;
        uint8_t full[FULL_GROUP_BYTES];
        for (int64_t line = 0; line < group_bytes; line += 64) PREFETCH(gp + PREFETCH_BYTES + line);
        if (t < GB) {
            pad_group(gp, t, kind, full);
            gp = full;
        }
        for (int h = 0; h < 2; h++) {
            VHalf w;
            vhalf(gp, h, kind, &w);
            for (int r = 0; r < NR; r++) acc[r][h] = vrow(&w, act + (r * ng + g) * GROUP_BYTES, h, kind, acc[r][h]);
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
