// fast_linear.c's AVX-512 path: a group is one 16-lane vector per part. VNNI's vpdpbusd forms the
// lanes where the CPU has it (Q8_0 as w + 128, corrected by the activations' corr); elsewhere
// vpmaddubsw + vpmaddwd on |w| and sign-flipped activations (no int16 overflow: |w| <= 127).
#define FAST_ROW_CHUNK 8  // rows whose accumulators stay in registers

static int features_per_call(int64_t rows) { return rows <= 2 ? 2 : 1; }

typedef struct {
    __m512i u[PARTS];        // the unsigned operand: Q4_1 q; Q8_0 w + 128 (VNNI) or |w|
    __mmask64 neg[PARTS];    // Q8_0 without VNNI: where w < 0 (the activation's sign flips)
    __m512 dw, m;            // lane b: block b's d and m
} VGroup;

static inline __m512i load_part(const uint8_t* p, int t) {  // 4t bytes, the rest 0
    return t == GB ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8((1ULL << (4 * t)) - 1, p);
}

static inline __m512 load_halves(const uint8_t* p, int t) {  // t fp16 values, the rest 0
    return _mm512_cvtph_ps(t == GB ? _mm256_loadu_si256((const __m256i*)p)
                                   : _mm256_maskz_loadu_epi16((__mmask16)((1u << t) - 1), p));
}

static inline __attribute__((always_inline)) void vgroup(const uint8_t* g, int t, const int kind, VGroup* w) {
    if (kind == KIND_Q4_1) {
        const __m512i low4 = _mm512_set1_epi8(0x0f);
        for (int v = 0; v < 4; v++) {
            __m512i raw = load_part(g + 4 * t * v, t);
            w->u[v] = _mm512_and_si512(raw, low4);
            w->u[v + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
        w->dw = load_halves(g + 16 * t, t);
        w->m = load_halves(g + 18 * t, t);
        return;
    }
    for (int v = 0; v < PARTS; v++) {
        w->u[v] = load_part(g + 4 * t * v, t);
#if !defined(__AVX512VNNI__)
        __m512i signed_w = _mm512_xor_si512(w->u[v], _mm512_set1_epi8((char)0x80));
        w->neg[v] = _mm512_movepi8_mask(signed_w);
        w->u[v] = _mm512_abs_epi8(signed_w);
#endif
    }
    w->dw = load_halves(g + 32 * t, t);
    w->m = _mm512_setzero_ps();
}

static inline __m512i dot4(__m512i acc, __m512i u, __m512i s) {  // acc + sums of 4 u8 x s8 products
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

static inline __attribute__((always_inline)) __m512 vrow(const VGroup* w, const uint8_t* act, const int kind,
                                                        __m512 acc) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();  // two chains: dot4's latency
#if defined(__AVX512VNNI__)
    if (kind == KIND_Q8_0) even = _mm512_loadu_si512(act + CORR_AT);
#endif
    for (int v = 0; v < PARTS; v += 2) {
        __m512i a0 = _mm512_loadu_si512(act + 64 * v), a1 = _mm512_loadu_si512(act + 64 * (v + 1));
#if !defined(__AVX512VNNI__)
        if (kind == KIND_Q8_0) {
            a0 = _mm512_mask_sub_epi8(a0, w->neg[v], _mm512_setzero_si512(), a0);
            a1 = _mm512_mask_sub_epi8(a1, w->neg[v + 1], _mm512_setzero_si512(), a1);
        }
#endif
        even = dot4(even, w->u[v], a0);
        odd = dot4(odd, w->u[v + 1], a1);
    }
    __m512 dots = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
    acc = _mm512_fmadd_ps(dots, _mm512_mul_ps(w->dw, _mm512_loadu_ps((const float*)(act + DX_AT))), acc);
    if (kind == KIND_Q4_1) acc = _mm512_fmadd_ps(w->m, _mm512_loadu_ps((const float*)(act + S_AT)), acc);
    return acc;
}

// A last group of t <= 8 blocks: the same lanes' arithmetic on their 256-bit half (on a CPU that
// splits 512-bit ops in two, half the cost; the other lanes would only add zeros).
typedef struct {
    __m256i u[PARTS];
    __mmask32 neg[PARTS];
    __m256 dw, m;
} VTail;

static inline __attribute__((always_inline)) void vtail(const uint8_t* g, int t, const int kind, VTail* w) {
    const __mmask32 bytes = (__mmask32)((1ULL << (4 * t)) - 1);
    const __mmask16 halves = (__mmask16)((1u << t) - 1);
    for (int v = 0; v < (kind == KIND_Q4_1 ? 4 : PARTS); v++) {
        __m256i raw = _mm256_maskz_loadu_epi8(bytes, g + 4 * t * v);
        if (kind == KIND_Q4_1) {
            w->u[v] = _mm256_and_si256(raw, _mm256_set1_epi8(0x0f));
            w->u[v + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
            continue;
        }
        w->u[v] = raw;
#if !defined(__AVX512VNNI__)
        __m256i signed_w = _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80));
        w->neg[v] = _mm256_movepi8_mask(signed_w);
        w->u[v] = _mm256_abs_epi8(signed_w);
#endif
    }
    const uint8_t* scales = g + (kind == KIND_Q4_1 ? 16 : 32) * t;
    w->dw = _mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)halves, scales));
    w->m = kind == KIND_Q4_1 ? _mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)halves, scales + 2 * t))
                             : _mm256_setzero_ps();
}

static inline __m256i dot4_256(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

static inline __attribute__((always_inline)) __m512 vtail_row(const VTail* w, const uint8_t* act, const int kind,
                                                             __m512 acc) {
    __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
#if defined(__AVX512VNNI__)
    if (kind == KIND_Q8_0) even = _mm256_loadu_si256((const __m256i*)(act + CORR_AT));
#endif
    for (int v = 0; v < PARTS; v += 2) {
        __m256i a0 = _mm256_loadu_si256((const __m256i*)(act + 64 * v));
        __m256i a1 = _mm256_loadu_si256((const __m256i*)(act + 64 * (v + 1)));
#if !defined(__AVX512VNNI__)
        if (kind == KIND_Q8_0) {
            a0 = _mm256_mask_sub_epi8(a0, w->neg[v], _mm256_setzero_si256(), a0);
            a1 = _mm256_mask_sub_epi8(a1, w->neg[v + 1], _mm256_setzero_si256(), a1);
        }
#endif
        even = dot4_256(even, w->u[v], a0);
        odd = dot4_256(odd, w->u[v + 1], a1);
    }
    __m256 dots = _mm256_cvtepi32_ps(_mm256_add_epi32(even, odd));
    __m256 low = _mm512_castps512_ps256(acc);
    low = _mm256_fmadd_ps(dots, _mm256_mul_ps(w->dw, _mm256_loadu_ps((const float*)(act + DX_AT))), low);
    if (kind == KIND_Q4_1) low = _mm256_fmadd_ps(w->m, _mm256_loadu_ps((const float*)(act + S_AT)), low);
    return _mm512_insertf32x8(acc, low, 0);
}

static inline float vlane_sum(__m512 v) {  // lane_sum's order
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 u = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

static inline __attribute__((always_inline)) void vfeatures(const uint8_t* first, int64_t stride, int64_t nb,
                                                           const int kind, const uint8_t* act, const int NR,
                                                           float* y, int64_t out, int64_t o, const int NF) {
    const int64_t group_bytes = GB * block_bytes(kind), ng = num_groups(nb);
    __m512 acc[2][FAST_ROW_CHUNK];
    for (int f = 0; f < NF; f++)
        for (int r = 0; r < NR; r++) acc[f][r] = _mm512_setzero_ps();
    // The NF features' bytes, PREFETCH_BYTES ahead: whole features, so a short last group and a
    // feature that starts inside a cache line are covered too (prefetching full groups only left
    // a 576-wide projection's last lines to demand misses; docs/performance.md).
    for (int64_t line = 0; line < NF * stride; line += 64) PREFETCH(first + PREFETCH_BYTES + line);
    for (int64_t g = 0; g < ng; g++) {
        int t = nb - g * GB < GB ? (int)(nb - g * GB) : GB;
        if (t <= GB / 2) {  // only in the last group
            VTail w[2];
            for (int f = 0; f < NF; f++) vtail(first + f * stride + g * group_bytes, t, kind, &w[f]);
            for (int r = 0; r < NR; r++)
                for (int f = 0; f < NF; f++)
                    acc[f][r] = vtail_row(&w[f], act + (r * ng + g) * GROUP_BYTES, kind, acc[f][r]);
            break;
        }
        VGroup w[2];
        for (int f = 0; f < NF; f++) vgroup(first + f * stride + g * group_bytes, t, kind, &w[f]);
        for (int r = 0; r < NR; r++)
            for (int f = 0; f < NF; f++) acc[f][r] = vrow(&w[f], act + (r * ng + g) * GROUP_BYTES, kind, acc[f][r]);
    }
    for (int f = 0; f < NF; f++)
        for (int r = 0; r < NR; r++) y[r * out + o + f] = vlane_sum(acc[f][r]);
}

#define FAST_CASE(KIND, NF, N) \
    case N: vfeatures(first, stride, nb, KIND, act, N, y, out, o, NF); return;
#define FAST_SWITCH(KIND, NF)                                                                     \
    switch (nr) {                                                                                 \
        FAST_CASE(KIND, NF, 1) FAST_CASE(KIND, NF, 2) FAST_CASE(KIND, NF, 3) FAST_CASE(KIND, NF, 4) \
        FAST_CASE(KIND, NF, 5) FAST_CASE(KIND, NF, 6) FAST_CASE(KIND, NF, 7) FAST_CASE(KIND, NF, 8) \
    }

static void fast_features(const uint8_t* first, int64_t stride, int64_t nb, int kind, const uint8_t* act, int nr,
                          float* y, int64_t out, int64_t o, int nf) {
    if (kind == KIND_Q4_1) {
        if (nf == 2) FAST_SWITCH(KIND_Q4_1, 2) else FAST_SWITCH(KIND_Q4_1, 1)
    } else {
        if (nf == 2) FAST_SWITCH(KIND_Q8_0, 2) else FAST_SWITCH(KIND_Q8_0, 1)
    }
}
