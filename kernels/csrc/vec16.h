// 16-float vectors (GCC/Clang vector extensions) for the C ops: AVX-512 registers under
// -march=native where the CPU has them, two AVX2 halves (or scalars) elsewhere, the same arithmetic
// order everywhere. (-O3 alone vectorised none of these loops: it prefers 256 bits and gave up on
// the reductions.)
#pragma once
#include <stdint.h>
#include <string.h>

typedef float vec16 __attribute__((vector_size(64)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));
typedef int32_t ivec16 __attribute__((vector_size(64)));
#define LANES 16

static inline vec16 vload(const float* p) {
    vec16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float* p, vec16 v) { memcpy(p, &v, sizeof v); }

static inline vec8 vload8(const float* p) {
    vec8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore8(float* p, vec8 v) { memcpy(p, &v, sizeof v); }

// Pairwise: a fixed order, a few shuffles instead of 15 dependent adds.
static inline float hsum(vec16 v) {
    vec8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
             __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    vec4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline float widen_float(float x) { return x; }

// NAME(a, b, n): a [n] . b [n], b's elements of type BT loaded 16 at a time by LOAD16 and one at a
// time by WIDEN (kv_type.h instantiates it over an fp16 KV row: the same order for both).
#define DOT_OF(NAME, BT, LOAD16, WIDEN)                                                   \
    static inline float NAME(const float* a, const BT* b, int64_t n) {                    \
        vec16 acc0 = {0}, acc1 = {0}; /* two chains: a 64-float head is 4 FMAs, 2 deep */ \
        int64_t i = 0;                                                                    \
        for (; i + 2 * LANES <= n; i += 2 * LANES) {                                      \
            acc0 += vload(a + i) * LOAD16(b + i);                                         \
            acc1 += vload(a + i + LANES) * LOAD16(b + i + LANES);                         \
        }                                                                                 \
        for (; i + LANES <= n; i += LANES) acc0 += vload(a + i) * LOAD16(b + i);          \
        float s = hsum(acc0 + acc1);                                                      \
        for (; i < n; i++) s += a[i] * WIDEN(b[i]);                                       \
        return s;                                                                         \
    }
DOT_OF(dot, float, vload, widen_float)

typedef int32_t ivec8 __attribute__((vector_size(32)));
typedef int32_t ivec4 __attribute__((vector_size(16)));

// Bit casts between float and int32 vectors of one width (comparison masks, exponent tricks).
#define BIT_CAST(NAME, TO, FROM)       \
    static inline TO NAME(FROM v) {    \
        TO out;                        \
        memcpy(&out, &v, sizeof out);  \
        return out;                    \
    }
BIT_CAST(as_float, vec16, ivec16)
BIT_CAST(as_int, ivec16, vec16)
BIT_CAST(as_float8, vec8, ivec8)
BIT_CAST(as_int8, ivec8, vec8)

// Masks of 16-float comparisons, all ones where true. Without AVX-512's mask registers GCC lowers a
// 16-float comparison lane by lane in scalar code (a third of a SiLU on AVX2), so there they are
// formed from the bits: the same masks, NaN included.
static inline ivec16 below_minus_87(vec16 x) {  // x < -87.f
#if defined(__AVX512F__)
    return x < -87.f;
#else
    ivec16 bits = as_int(x), magnitude = bits & 0x7fffffff;
    ivec16 larger = (0x42ae0000 - magnitude) >> 31;  // |x| > 87 (0x42ae0000: 87.f)
    ivec16 number = (magnitude - 0x7f800001) >> 31;  // |x| <= inf: not NaN
    return larger & number & (bits >> 31);
#endif
}

// exp(x) for x <= 0 (softmax scores minus their maximum, SiLU's -|x|), 0 below -87 (and for -inf). Cephes'
// expf polynomial after x = n ln2 + r: within 2 ulp of libm's expf, 16 at a time (libm's scalar
// expf was a fifth of attention).
static inline vec16 exp16(vec16 x) {
    ivec16 dead = below_minus_87(x);  // all ones where exp underflows (or x = -inf)
    vec16 floor = (vec16){0} - 87.f;
    x = as_float((as_int(x) & ~dead) | (as_int(floor) & dead));  // n stays a normal exponent
    vec16 n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
    vec16 r = x - n * 0.693359375f - n * -2.12194440e-4f;
    vec16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    vec16 two_n = as_float((__builtin_convertvector(n, ivec16) + 127) << 23);
    return as_float(as_int(p * two_n) & ~dead);
}
