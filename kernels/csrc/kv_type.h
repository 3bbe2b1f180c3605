// The KV cache's element type for attention.c: fp32, or fp16 where the file is compiled with
// KV_HALF (attention_f16.c; a 16-bit cache halves the bytes a decode row's attention reads).
// Loads widen to fp32, so the arithmetic after them is the fp32 path's.
#pragma once
#include <stdint.h>
#include <string.h>

#include "vec16.h"

#if defined(KV_HALF)
#include <immintrin.h>

typedef _Float16 kv_t;
#define KV_NAME(name) name##_f16

static inline float kvf(kv_t x) { return (float)x; }

static inline vec16 kvload(const kv_t* p) {  // 16 halves -> 16 floats
#if defined(__AVX512F__)
    return (vec16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__F16C__)
    vec8 lo = (vec8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
    vec8 hi = (vec8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)));
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    vec16 v;
    for (int i = 0; i < 16; i++) v[i] = (float)p[i];
    return v;
#endif
}

static inline vec8 kvload8(const kv_t* p) {
#if defined(__F16C__)
    return (vec8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
    vec8 v;
    for (int i = 0; i < 8; i++) v[i] = (float)p[i];
    return v;
#endif
}
#else
typedef float kv_t;
#define KV_NAME(name) name

static inline float kvf(kv_t x) { return x; }
static inline vec16 kvload(const kv_t* p) { return vload(p); }
static inline vec8 kvload8(const kv_t* p) { return vload8(p); }
#endif

// q [n] . key [n] (a KV row): `dot`'s order and chains.
DOT_OF(kv_dot, kv_t, kvload, kvf)
