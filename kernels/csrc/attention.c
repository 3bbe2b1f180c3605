// Attention for steps of short sequences on the CPU (decode, verification chains and trees).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vec16.h"

#define MAX_GROUP 4  // query heads whose outputs share the value loads (GQA group, or a chunk of it)

// o[g] [dim] = sum_j p[g][j] * v_j for g < num (p rows s_stride apart, o rows dim apart), with
// v_j = values + slots[j] * dim. Each value vector is loaded once for the whole group, and the
// outputs stay in registers (a load-add-store per key was a third of attention): 64 floats at a
// time on AVX-512; 16 on AVX2, whose 16 registers spilled every accumulator of the 64-float
// version, so there each value row is read dim / 16 times from L1/L2.
static void weighted_values(const float* p, int64_t s_stride, int num, const float* values,
                            const int64_t* slots, int64_t n, int64_t dim, float* o) {
    int64_t d0 = 0;
#if defined(__AVX512F__)
    for (; d0 + 4 * LANES <= dim; d0 += 4 * LANES) {
        vec16 acc[MAX_GROUP][4] = {{{0}}};
        for (int64_t j = 0; j < n; j++) {
            const float* v = values + slots[j] * dim + d0;
            vec16 vj[4] = {vload(v), vload(v + LANES), vload(v + 2 * LANES), vload(v + 3 * LANES)};
            for (int g = 0; g < num; g++)
                for (int k = 0; k < 4; k++) acc[g][k] += p[g * s_stride + j] * vj[k];
        }
        for (int g = 0; g < num; g++)
            for (int k = 0; k < 4; k++) vstore(o + g * dim + d0 + k * LANES, acc[g][k]);
    }
#else
    for (; d0 + 16 <= dim; d0 += 16) {
        vec8 acc[MAX_GROUP][2] = {{{0}}};
        for (int64_t j = 0; j < n; j++) {
            const float* v = values + slots[j] * dim + d0;
            vec8 v0 = vload8(v), v1 = vload8(v + 8);
            for (int g = 0; g < num; g++) {
                float pj = p[g * s_stride + j];
                acc[g][0] += pj * v0;
                acc[g][1] += pj * v1;
            }
        }
        for (int g = 0; g < num; g++) {
            vstore8(o + g * dim + d0, acc[g][0]);
            vstore8(o + g * dim + d0 + 8, acc[g][1]);
        }
    }
#endif
    for (; d0 < dim; d0++)
        for (int g = 0; g < num; g++) {
            float acc = 0.f;
            for (int64_t j = 0; j < n; j++) acc += p[g * s_stride + j] * values[slots[j] * dim + d0];
            o[g * dim + d0] = acc;
        }
}

// The dot products of q [dim] with 16 keys (dim % 16 == 0) as one vector, lane k for key k. Each
// key's 16 partial sums are folded with the other keys' (a transpose-and-add, 31 shuffles for the
// 16 keys) instead of reduced one key at a time (about 5 shuffles and 3 scalar adds each).
static inline vec16 dot16(const float* q, const float* keys, const int64_t* slots, int64_t dim) {
    vec16 acc[16];
    for (int k = 0; k < 16; k++) {
        const float* key = keys + slots[k] * dim;
        acc[k] = vload(q) * vload(key);
        for (int64_t i = LANES; i < dim; i += LANES) acc[k] += vload(q + i) * vload(key + i);
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
static inline vec8 dot8(const float* q, const float* keys, const int64_t* slots, int64_t dim) {
    vec8 acc[8];
    for (int k = 0; k < 8; k++) {
        const float* key = keys + slots[k] * dim;
        acc[k] = vload8(q) * vload8(key);
        for (int64_t i = 8; i < dim; i += 8) acc[k] += vload8(q + i) * vload8(key + i);
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

// exp(x) for x <= 0 (scores minus their maximum), 0 below -87 (and for -inf, masked keys). Cephes'
// expf polynomial after x = n ln2 + r: within 2 ulp of libm's expf, 16 at a time (libm's scalar
// expf was a fifth of attention).
static inline vec16 exp16(vec16 x) {
    ivec16 dead = x < -87.f;  // all ones where exp underflows (or x = -inf)
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

// Softmax of s [n] in place (masked keys hold -inf and get 0).
static void softmax(float* s, int64_t n) {
    float top = -INFINITY;
    for (int64_t j = 0; j < n; j++) top = s[j] > top ? s[j] : top;
    vec16 totals = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES) {
        vec16 e = exp16(vload(s + j) - top);
        vstore(s + j, e);
        totals += e;
    }
    float total = hsum(totals);
    for (; j < n; j++) {
        s[j] = s[j] == -INFINITY ? 0.f : expf(s[j] - top);
        total += s[j];
    }
    float inv = 1.f / total;
    for (j = 0; j < n; j++) s[j] *= inv;
}

// `num` query heads (q rows dim apart) that share one KV head, over their sequence's keys: the
// first `ctx` all visible, the next n - ctx where visible_new says, then `pad` dummy keys that are
// scored and dropped. s [num, s_stride >= n + pad] scratch; o [num, dim] out.
static void attend(const float* q, int num, const float* keys, const float* values, const int64_t* slots,
                   int64_t ctx, int64_t n, int64_t pad, const uint8_t* visible_new, int64_t dim,
                   float scale, float* s, int64_t s_stride, float* o) {
    int64_t j = 0;
#if defined(__AVX512F__)
    if (dim % LANES == 0)  // 16 keys at a time, in L1 for every head of the group
        for (; j + LANES <= n + pad; j += LANES)
            for (int g = 0; g < num; g++)
                vstore(s + g * s_stride + j, scale * dot16(q + g * dim, keys, slots + j, dim));
#else
    if (dim % 8 == 0)  // 8 keys at a time, in L1 for every head of the group
        for (; j + 8 <= n + pad; j += 8)
            for (int g = 0; g < num; g++)
                vstore8(s + g * s_stride + j, scale * dot8(q + g * dim, keys, slots + j, dim));
#endif
    for (; j < n + pad; j++)  // pad keys too: stored, so the work is not optimised out
        for (int g = 0; g < num; g++) s[g * s_stride + j] = scale * dot(q + g * dim, keys + slots[j] * dim, dim);
    for (int g = 0; g < num; g++) {
        for (j = ctx; j < n; j++)
            if (!visible_new[j - ctx]) s[g * s_stride + j] = -INFINITY;
        softmax(s + g * s_stride, n);
    }
    weighted_values(s, s_stride, num, values, slots, n, dim, o);
}

// Attention for a step of short sequences (decode, verification chains and trees), each query row
// over its own sequence's keys only: its context (all visible) and the new tokens `new_mask` marks
// (its ancestry). q rows have stride q_stride floats, heads of `dim`; kv [2 * kv_heads, num_slots,
// dim] (keys then values); key_slots [num_keys]; per row: key_start (its sequence's first key in
// key_slots), num_ctx, num_pad (the padded baseline's masked dummy keys after the sequence's
// num_new keys: scored, then dropped, as a padded kernel would); new_mask [rows, max_new]
// (1 = visible); out [rows, heads * dim]; scratch [rows * heads * max_keys].
void specray_attention(const float* q, int64_t q_stride, int64_t rows, int64_t heads, int64_t kv_heads,
                       int64_t dim, const float* kv, int64_t num_slots, const int64_t* key_slots,
                       const int64_t* key_start, const int64_t* num_ctx, const int64_t* num_new,
                       const int64_t* num_pad, const uint8_t* new_mask, int64_t max_new, float scale,
                       float* out, float* scratch, int64_t max_keys, int threads) {
    int64_t group = heads / kv_heads, chunks = (group + MAX_GROUP - 1) / MAX_GROUP;
    int64_t work = rows * heads * max_keys * dim;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (work > (1 << 18))
    for (int64_t t = 0; t < rows; t++)
        for (int64_t c = 0; c < kv_heads * chunks; c++) {  // chunk c of KV head c / chunks's group
            int64_t kvh = c / chunks, h = kvh * group + (c % chunks) * MAX_GROUP;
            int num = (int)(group - (c % chunks) * MAX_GROUP < MAX_GROUP ? group - (c % chunks) * MAX_GROUP : MAX_GROUP);
            attend(q + t * q_stride + h * dim, num, kv + kvh * num_slots * dim, kv + (kv_heads + kvh) * num_slots * dim,
                   key_slots + key_start[t], num_ctx[t], num_ctx[t] + num_new[t], num_pad[t],
                   new_mask + t * max_new, dim, scale, scratch + (t * heads + h) * max_keys, max_keys,
                   out + (t * heads + h) * dim);
        }
}
