// Small fused CPU ops for few-row decode steps: each replaces several eager torch ops whose
// dispatch overhead (not their arithmetic) dominated a batch-1 step. fp32, contiguous rows.
#include <math.h>
#include <stdint.h>
#include <string.h>

// 16 floats as one GCC/Clang vector: AVX-512 registers under -march=native where the CPU has them,
// two AVX2 halves (or scalars) elsewhere, same arithmetic order everywhere. (-O3 alone vectorised
// none of these loops: it prefers 256 bits and gave up on the reductions.)
typedef float vec16 __attribute__((vector_size(64)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));
#define LANES 16

static inline vec16 vload(const float* p) {
    vec16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float* p, vec16 v) { memcpy(p, &v, sizeof v); }

// Pairwise: a fixed order, a few shuffles instead of 15 dependent adds.
static inline float hsum(vec16 v) {
    vec8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
             __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    vec4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline float dot(const float* a, const float* b, int64_t n) {
    vec16 acc0 = {0}, acc1 = {0};  // two chains: a 64-float head is 4 FMAs, 2 deep
    int64_t i = 0;
    for (; i + 2 * LANES <= n; i += 2 * LANES) {
        acc0 += vload(a + i) * vload(b + i);
        acc1 += vload(a + i + LANES) * vload(b + i + LANES);
    }
    for (; i + LANES <= n; i += LANES) acc0 += vload(a + i) * vload(b + i);
    float s = hsum(acc0 + acc1);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

// o [dim] = sum_j p[j] * v_j with v_j = values + slots[j] * dim; keys with p[j] == 0 skipped. The
// output stays in registers 64 floats at a time (a load-add-store per key was a third of attention).
static void weighted_values(const float* p, const float* values, const int64_t* slots, int64_t n,
                            int64_t dim, float* o) {
    int64_t d0 = 0;
    for (; d0 + 4 * LANES <= dim; d0 += 4 * LANES) {
        vec16 acc[4] = {{0}, {0}, {0}, {0}};
        for (int64_t j = 0; j < n; j++) {
            if (p[j] == 0.f) continue;
            const float* v = values + slots[j] * dim + d0;
            for (int k = 0; k < 4; k++) acc[k] += p[j] * vload(v + k * LANES);
        }
        for (int k = 0; k < 4; k++) vstore(o + d0 + k * LANES, acc[k]);
    }
    for (; d0 < dim; d0++) {
        float acc = 0.f;
        for (int64_t j = 0; j < n; j++) acc += p[j] * values[slots[j] * dim + d0];
        o[d0] = acc;
    }
}

// y = w * (x * rsqrt(mean(x^2) + eps)) per row (the Llama order). x, y [rows, n]; w [n].
void specray_rms_norm(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* y) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * n;
        float inv = 1.f / sqrtf(dot(xr, xr, n) / (float)n + eps);
        for (int64_t i = 0; i < n; i++) y[r * n + i] = w[i] * (xr[i] * inv);
    }
}

// h += delta (the residual), then y = rms_norm(h). h, delta, y [rows, n].
void specray_add_rms_norm(float* h, const float* delta, int64_t rows, int64_t n, const float* w,
                          float eps, float* y) {
    for (int64_t i = 0; i < rows * n; i++) h[i] += delta[i];
    specray_rms_norm(h, rows, n, w, eps, y);
}

// RoPE (rotate-half form) on the query and key heads of qkv [rows, heads + 2 * kv_heads, dim] in
// place, then the rotated keys and the values into kv [2 * kv_heads, num_slots, dim] at `slots`.
// cos, sin [rows, dim].
void specray_rope_store_kv(float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                           const float* cos, const float* sin, const int64_t* slots, float* kv,
                           int64_t num_slots) {
    int64_t half = dim / 2, width = (heads + 2 * kv_heads) * dim;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * dim, *s = sin + r * dim;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            float* x = qkv + r * width + h * dim;
            for (int64_t i = 0; i < half; i++) {
                float a = x[i], b = x[i + half];
                x[i] = a * c[i] - b * s[i];
                x[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
        for (int64_t h = 0; h < 2 * kv_heads; h++) {
            const float* src = qkv + r * width + (heads + h) * dim;
            float* dst = kv + (h * num_slots + slots[r]) * dim;
            for (int64_t i = 0; i < dim; i++) dst[i] = src[i];
        }
    }
}

// One query head over its sequence's keys; s [n + pad] scratch, o [dim] out.
static void attend(const float* qh, const float* keys, const float* values, const int64_t* slots,
                   int64_t ctx, int64_t n, int64_t pad, const uint8_t* visible_new, int64_t dim,
                   float scale, float* s, float* o) {
    float top = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        s[j] = (j < ctx || visible_new[j - ctx]) ? scale * dot(qh, keys + slots[j] * dim, dim) : -INFINITY;
        top = s[j] > top ? s[j] : top;
    }
    for (int64_t j = n; j < n + pad; j++)  // stored, so the work is not optimised out
        s[j] = scale * dot(qh, keys + slots[j] * dim, dim);
    float total = 0.f;
    for (int64_t j = 0; j < n; j++) {
        s[j] = s[j] == -INFINITY ? 0.f : expf(s[j] - top);
        total += s[j];
    }
    float inv = 1.f / total;
    for (int64_t j = 0; j < n; j++) s[j] *= inv;
    weighted_values(s, values, slots, n, dim, o);
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
    int64_t group = heads / kv_heads, work = rows * heads * max_keys * dim;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (work > (1 << 18))
    for (int64_t t = 0; t < rows; t++)
        for (int64_t h = 0; h < heads; h++)
            attend(q + t * q_stride + h * dim, kv + (h / group) * num_slots * dim,
                   kv + (kv_heads + h / group) * num_slots * dim, key_slots + key_start[t], num_ctx[t],
                   num_ctx[t] + num_new[t], num_pad[t], new_mask + t * max_new, dim, scale,
                   scratch + (t * heads + h) * max_keys, out + (t * heads + h) * dim);
}
