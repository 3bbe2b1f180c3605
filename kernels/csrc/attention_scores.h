// A query's scores against a block of keys, and the softmax over a row's scores: attention.c's
// arithmetic per key, the same wherever a key falls (included once per KV type).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include "kv_type.h"
#include "vec16.h"

// a * b + c in one rounding where the CPU has FMA, as the compiler contracts `c += a * b` in a loop;
// spelled out, so no unrolling can contract it the other way round (a * b rounded, added into c).
#if defined(__AVX512F__)
#define FMA16(a, b, c) ((vec16)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#else
#define FMA16(a, b, c) ((c) + (a) * (b))
#endif
#if defined(__FMA__)
#define FMA8(a, b, c) ((vec8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#else
#define FMA8(a, b, c) ((c) + (a) * (b))
#endif

// The dot products of q [dim] with 16 keys (dim % 16 == 0) as one vector, lane k for key k. Each
// key's 16 partial sums are folded with the other keys' (a transpose-and-add, 31 shuffles for the
// 16 keys) instead of reduced one key at a time (about 5 shuffles and 3 scalar adds each).
static inline __attribute__((always_inline)) vec16 dot16(const float* q, const kv_t* keys, const int64_t* slots,
                                                        int64_t dim) {
    vec16 acc[16];
    for (int k = 0; k < 16; k++) {
        const kv_t* key = keys + slots[k] * dim;
        acc[k] = vload(q) * kvload(key);
        for (int64_t i = LANES; i < dim; i += LANES) acc[k] = FMA16(vload(q + i), kvload(key + i), acc[k]);
    }
    vec16 l1[8], l2[4], l3[2];
    for (int i = 0; i < 8; i++)  // lanes 0-7: key 2i's 8 partials, 8-15: key 2i + 1's
        l1[i] = __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)  // 4 partials per key
        l2[i] = __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
                __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)  // 2 partials per key
        l3[i] = __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
                __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    vec16 sums = __builtin_shufflevector(l3[0], l3[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
                 __builtin_shufflevector(l3[0], l3[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    // lane L now holds key bit_reverse_4(L)
    return __builtin_shufflevector(sums, sums, 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
}

// AVX2: the same transpose-and-add over 8 keys with 8-float vectors (16 keys of 16-float vectors
// need 32 accumulators: on AVX2's 16 registers they all spilled).
static inline __attribute__((always_inline)) vec8 dot8(const float* q, const kv_t* keys, const int64_t* slots,
                                                      int64_t dim) {
    vec8 acc[8];
    for (int k = 0; k < 8; k++) {
        const kv_t* key = keys + slots[k] * dim;
        acc[k] = vload8(q) * kvload8(key);
        for (int64_t i = 8; i < dim; i += 8) acc[k] = FMA8(vload8(q + i), kvload8(key + i), acc[k]);
    }
    vec8 l1[4], l2[2];
    for (int i = 0; i < 4; i++)  // lanes 0-3: key 2i's 4 partials, 4-7: key 2i + 1's
        l1[i] = __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int i = 0; i < 2; i++)  // 2 partials each: keys 4i, 4i + 2, 4i + 1, 4i + 3
        l2[i] = __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
                __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    vec8 sums = __builtin_shufflevector(l2[0], l2[1], 0, 2, 4, 6, 8, 10, 12, 14) +
                __builtin_shufflevector(l2[0], l2[1], 1, 3, 5, 7, 9, 11, 13, 15);
    // lanes hold keys 0, 2, 1, 3, 4, 6, 5, 7
    return __builtin_shufflevector(sums, sums, 0, 2, 1, 3, 4, 6, 5, 7);
}

// A block's scores at s: all 16 (8) lanes, or the first k_n of a last partial block (a full block's
// variable-length memcpy was a libc call a block and head).
#define STORE_SCORES(NAME, VEC, STORE, WIDTH)                   \
    static inline void NAME(float* s, VEC v, int64_t k_n) {     \
        if (k_n == WIDTH) {                                     \
            STORE(s, v);                                        \
            return;                                             \
        }                                                       \
        float sv[WIDTH];                                        \
        STORE(sv, v);                                           \
        memcpy(s, sv, k_n * sizeof(float));                     \
    }
STORE_SCORES(store_scores, vec16, vstore, 16)
STORE_SCORES(store_scores8, vec8, vstore8, 8)

// The largest of s [n], 16 at a time (a maximum is exact in any order: the scalar loop's dependent
// compares were a fifth of a decode row's attention; which of +0 and -0 wins changes no exp below).
static inline float max_of(const float* s, int64_t n) {
    int64_t j = 0;
    float top = -INFINITY;
    if (n >= LANES) {
#if defined(__AVX512F__) || !defined(__AVX__)
        vec16 tops = vload(s);
        for (j = LANES; j + LANES <= n; j += LANES) {
            vec16 v = vload(s + j);
            tops = as_float((as_int(v) & (v > tops)) | (as_int(tops) & ~(v > tops)));
        }
#else  // two 8-float halves: GCC lowers a 16-float comparison to scalar code here (vec16.h)
        __m256 low = _mm256_loadu_ps(s), high = _mm256_loadu_ps(s + 8);
        for (j = LANES; j + LANES <= n; j += LANES) {  // max_ps(v, t) is v > t ? v : t
            low = _mm256_max_ps(_mm256_loadu_ps(s + j), low);
            high = _mm256_max_ps(_mm256_loadu_ps(s + j + 8), high);
        }
        float tops[LANES];
        _mm256_storeu_ps(tops, low);
        _mm256_storeu_ps(tops + 8, high);
#endif
        for (int k = 0; k < LANES; k++) top = tops[k] > top ? tops[k] : top;
    }
    for (; j < n; j++) top = s[j] > top ? s[j] : top;
    return top;
}

// Softmax of s [n] in place (masked keys hold -inf and get 0).
static void softmax(float* s, int64_t n) {
    float top = max_of(s, n);
    vec16 totals = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES) {
        vec16 e = exp16(vload(s + j) - top);
        vstore(s + j, e);
        totals += e;
    }
    if (j < n) {  // the last partial block the same way, padded with masked keys (exp = 0)
        float tail[LANES];
        for (int k = 0; k < LANES; k++) tail[k] = j + k < n ? s[j + k] : -INFINITY;
        vec16 e = exp16(vload(tail) - top);
        vstore(tail, e);
        memcpy(s + j, tail, (n - j) * sizeof(float));
        totals += e;
    }
    float total = hsum(totals);  // key j in lane j % 16 whatever n is: masked keys add exact zeros
    float inv = 1.f / total;
    for (j = 0; j < n; j++) s[j] *= inv;
}
