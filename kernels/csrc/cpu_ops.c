// Small fused CPU ops for few-row decode steps: each replaces several eager torch ops whose
// dispatch overhead (not their arithmetic) dominated a batch-1 step. fp32, contiguous rows.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "parallel.h"
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
// place, then the rotated keys and the values into kv [2 * kv_heads, num_slots, dim] at `slots`
// (fp32, or fp16 where kv_half). cos, sin [rows, dim].
void specray_rope_store_kv(float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                           const float* cos, const float* sin, const int64_t* slots, void* kv,
                           int64_t num_slots, int kv_half) {
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
            int64_t at = (h * num_slots + slots[r]) * dim;
            if (kv_half)  // round to nearest even, as torch's .half()
                for (int64_t i = 0; i < dim; i++) ((_Float16*)kv)[at + i] = (_Float16)src[i];
            else
                memcpy((float*)kv + at, src, dim * sizeof(float));
        }
    }
}

// out[r] = argmax of x [rows, n] row r, as torch.argmax: the first maximal index, or the first NaN.
// Why: torch's CPU argmax runs ~0.7 G floats/s, 1 ms for a 16-row vocabulary step. One pass, 8
// floats at a time: each lane keeps its maximum and where it first saw it (strict >, so the first
// of equal values stays), NaNs tracked apart; then the lanes' maxima, ties to the lower index.
// (A max pass then a first-equal pass on 16-float vectors was 3x slower than torch on AVX2.)
static int64_t argmax_row(const float* x, int64_t n) {
    int64_t i = 0, best_i = INT64_MAX;
    float best = -INFINITY;
    if (n >= 8) {
        vec8 m = vload8(x);
        ivec8 at = {0, 1, 2, 3, 4, 5, 6, 7}, idx = at, nan_seen = m != m;
        for (i = 8; i + 8 <= n; i += 8) {
            vec8 v = vload8(x + i);
            idx += 8;
            ivec8 gt = v > m;  // false for NaN
            nan_seen |= v != v;
            m = as_float8((gt & as_int8(v)) | (~gt & as_int8(m)));
            at = (gt & idx) | (~gt & at);
        }
        ivec4 nan4 = __builtin_shufflevector(nan_seen, nan_seen, 0, 1, 2, 3) |
                     __builtin_shufflevector(nan_seen, nan_seen, 4, 5, 6, 7);
        if (nan4[0] | nan4[1] | nan4[2] | nan4[3]) return -1;  // the scalar scan finds the first NaN
        for (int j = 0; j < 8; j++)
            if (m[j] > best || (m[j] == best && at[j] < best_i)) best = m[j], best_i = at[j];
    }
    for (; i < n; i++) {
        if (x[i] != x[i]) return -1;
        if (x[i] > best || best_i == INT64_MAX) best = x[i], best_i = i;
    }
    return best_i;  // every value -inf: the first, as torch
}

static int64_t first_nan(const float* x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != x[i]) return i;
    return 0;
}

typedef struct {
    const float* x;
    int64_t n;
    int64_t* out;
} ArgmaxJob;

static void argmax_chunk(void* ctx, int64_t r0, int64_t r1, int thread, int fresh) {
    (void)thread, (void)fresh;
    const ArgmaxJob* j = (const ArgmaxJob*)ctx;
    for (int64_t r = r0; r < r1; r++) {
        int64_t a = argmax_row(j->x + r * j->n, j->n);
        j->out[r] = a >= 0 ? a : first_nan(j->x + r * j->n, j->n);
    }
}

void specray_argmax_rows(const float* x, int64_t rows, int64_t n, int64_t* out, int threads) {
    ArgmaxJob job = {x, n, out};
    specray_parallel(rows, 1, rows >= 4 ? threads : 1, argmax_chunk, &job);
}
