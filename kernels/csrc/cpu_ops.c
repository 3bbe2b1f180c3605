// Small fused CPU ops for few-row decode steps: each replaces several eager torch ops whose
// dispatch overhead (not their arithmetic) dominated a batch-1 step. fp32, contiguous rows.
#include <math.h>
#include <stdint.h>

#define LANES 16  // partial sums, so that the compiler vectorises in a fixed summation order

static float dot(const float* a, const float* b, int64_t n) {
    float part[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) part[j] += a[i + j] * b[i + j];
    float s = 0.f;
    for (int j = 0; j < LANES; j++) s += part[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
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
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (work > (1 << 16))
    for (int64_t t = 0; t < rows; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float* qh = q + t * q_stride + h * dim;
            const float* keys = kv + (h / group) * num_slots * dim;
            const float* values = kv + (kv_heads + h / group) * num_slots * dim;
            const int64_t* slots = key_slots + key_start[t];
            int64_t ctx = num_ctx[t], n = ctx + num_new[t];
            float* s = scratch + (t * heads + h) * max_keys;
            float top = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                s[j] = (j < ctx || new_mask[t * max_new + j - ctx]) ? scale * dot(qh, keys + slots[j] * dim, dim)
                                                                   : -INFINITY;
                top = s[j] > top ? s[j] : top;
            }
            for (int64_t j = n; j < n + num_pad[t]; j++)  // stored, so the work is not optimised out
                s[j] = scale * dot(qh, keys + slots[j] * dim, dim);
            float total = 0.f;
            for (int64_t j = 0; j < n; j++) {
                s[j] = s[j] == -INFINITY ? 0.f : expf(s[j] - top);
                total += s[j];
            }
            float* o = out + (t * heads + h) * dim;
            for (int64_t d = 0; d < dim; d++) o[d] = 0.f;
            for (int64_t j = 0; j < n; j++) {
                if (s[j] == 0.f) continue;
                const float* v = values + slots[j] * dim;
                float p = s[j] / total;
                for (int64_t d = 0; d < dim; d++) o[d] += p * v[d];
            }
        }
}
