// Small fused CPU ops for few-row decode steps: each replaces several eager torch ops whose
// dispatch overhead (not their arithmetic) dominated a batch-1 step. fp32, contiguous rows.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vec16.h"

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

// out[r] = argmax of x [rows, n] row r, as torch.argmax: the first maximal index, or the first NaN.
// Why: torch's CPU argmax runs ~0.7 G floats/s, 1 ms for a 16-row vocabulary step; this is a max
// pass (NaN tracked apart) then a first-equal pass, both 16 floats at a time.
static int64_t argmax_row(const float* x, int64_t n) {
    int64_t i = 0;
    float best = -INFINITY;
    if (n >= LANES) {
        vec16 m = vload(x), nan_seen = {0};
        for (i = LANES; i + LANES <= n; i += LANES) {
            vec16 v = vload(x + i);
            nan_seen = as_float(as_int(nan_seen) | (v != v));
            m = as_float((v > m) & as_int(v) | ~(v > m) & as_int(m));
        }
        nan_seen = as_float(as_int(nan_seen) | (m != m));
        for (int j = 0; j < LANES; j++) {
            if (as_int(nan_seen)[j]) return -1;  // a NaN somewhere: the scalar scan finds the first
            best = m[j] > best ? m[j] : best;
        }
    }
    for (; i < n; i++) {
        if (x[i] != x[i]) return -1;
        best = x[i] > best ? x[i] : best;
    }
    vec16 b = {0};
    b += best;
    for (i = 0; i + LANES <= n; i += LANES) {
        ivec16 hit = vload(x + i) == b;
        for (int j = 0; j < LANES; j++)  // rare: only the block holding the maximum gets here
            if (hit[j]) return i + j;
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0;  // every value -inf: torch answers 0 too
}

static int64_t first_nan(const float* x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != x[i]) return i;
    return 0;
}

void specray_argmax_rows(const float* x, int64_t rows, int64_t n, int64_t* out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= 4)
    for (int64_t r = 0; r < rows; r++) {
        int64_t a = argmax_row(x + r * n, n);
        out[r] = a >= 0 ? a : first_nan(x + r * n, n);
    }
}
