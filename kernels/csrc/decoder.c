// Every decoder layer of a few-row step in one native call (CPU, fp32 activations, packed weights).
//
// Why: with packed weights a SmolLM2 decode step's projections take about half of it; the other
// half was some 300 Python-driven calls (ctypes marshalling, tensor allocation, eager silu and
// mul). This runs the same kernels in the same order as `LlamaModel.forward`'s fused path, so it
// computes the same thing; each row's arithmetic still ignores the other rows.
#include <stdint.h>
#include <string.h>

#include "vec16.h"

void specray_exact_linear(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, int kind,
                          int64_t out, float* y, int threads);
void specray_rms_norm(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* y);
void specray_add_rms_norm(float* h, const float* delta, int64_t rows, int64_t n, const float* w, float eps,
                          float* y);
void specray_rope_store_kv(float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                           const float* cos, const float* sin, const int64_t* slots, void* kv, int64_t num_slots,
                           int kv_half);
#define ATTENTION_ARGS                                                                                          \
    const float *q, int64_t q_stride, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, const void *kv, \
        int64_t num_slots, const int64_t *key_slots, const int64_t *key_start, const int64_t *num_ctx,          \
        const int64_t *num_new, const int64_t *num_pad, const uint8_t *new_mask, int64_t max_new, float scale,  \
        float *out, float *scratch, int64_t max_keys, int threads
void specray_attention(ATTENTION_ARGS);
void specray_attention_f16(ATTENTION_ARGS);  // attention_f16.c: the same over an fp16 cache
int64_t specray_attention_split_scratch(int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, int64_t max_new);
int64_t specray_attention_score_floats(int64_t group, int64_t max_keys);
int64_t specray_fast_scratch_bytes(int64_t rows, int64_t in);
void specray_fast16_linear(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, int kind, int64_t out,
                           float* y, uint8_t* act, int threads);
void specray_fast_linear(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, int kind, int64_t out,
                         float* y, uint8_t* act, int threads);

// A layer's phases, timed only in a build with -DSPECRAY_PHASE_TIMES (benchmarks/decoder_phases.py):
// nanoseconds summed over calls in specray_phase_ns; the product's build has none of it.
enum { P_QKV, P_ROPE, P_ATTENTION, P_O, P_POST_NORM, P_GATE_UP, P_SILU, P_DOWN, P_NEXT_NORM, P_COUNT };
#ifdef SPECRAY_PHASE_TIMES
#include <time.h>
double specray_phase_ns[P_COUNT];
static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}
#define PHASES_START double phase_t = now_ns()
#define PHASE(p)                                    \
    do {                                            \
        double phase_now = now_ns();                \
        specray_phase_ns[p] += phase_now - phase_t; \
        phase_t = phase_now;                        \
    } while (0)
#else
#define PHASES_START
#define PHASE(p)
#endif

// dims: what `specray_decoder_layers` reads from its `dims` argument.
enum { D_HIDDEN, D_HEADS, D_KV_HEADS, D_HEAD_DIM, D_INTERMEDIATE, D_LAYERS, D_COUNT };
// A layer's row of the weight table: addresses of the packed blocks, then of the two norm weights.
enum { W_QKV, W_O, W_GATE_UP, W_DOWN, W_INPUT_NORM, W_POST_NORM, W_COUNT };
// below KIND_FAST: quant_linear.c's exact kinds; KIND_FAST + kind: fast_linear.c's layout, 8-bit
// activations; KIND_FAST16 + kind: the same layout, two-part activations (the fast16 mode)
enum { KIND_FAST = 8, KIND_FAST16 = 16 };

typedef struct {  // the step's scratch, carved out of one buffer
    float *x, *qkv, *attn, *delta, *gate_up, *act, *scores;
    uint8_t* quantised;  // the fast kernels' 8-bit activations, two parts a row in fast16 (after the attention's scratch)
} Workspace;

// Floats of each part of the workspace, in Workspace's order.
static void part_sizes(int64_t rows, const int64_t* d, int64_t max_keys, int64_t sizes[7]) {
    int64_t width = (d[D_HEADS] + 2 * d[D_KV_HEADS]) * d[D_HEAD_DIM];
    int64_t parts[6] = {d[D_HIDDEN], width, d[D_HEADS] * d[D_HEAD_DIM], d[D_HIDDEN], 2 * d[D_INTERMEDIATE],
                        d[D_INTERMEDIATE]};
    for (int i = 0; i < 6; i++) sizes[i] = rows * parts[i];
    sizes[6] = specray_attention_score_floats(d[D_HEADS] / d[D_KV_HEADS], max_keys);  // per thread, not per row
}

static Workspace carve(float* work, int64_t rows, const int64_t* d, int64_t max_keys) {
    int64_t sizes[7];
    part_sizes(rows, d, max_keys, sizes);
    float** fields[7];
    Workspace w;
    fields[0] = &w.x, fields[1] = &w.qkv, fields[2] = &w.attn, fields[3] = &w.delta;
    fields[4] = &w.gate_up, fields[5] = &w.act, fields[6] = &w.scores;
    for (int i = 0; i < 7; i++) {
        *fields[i] = work;
        work += sizes[i];
    }
    // the split attention's scratch follows the scores, then the 8-bit activations
    uintptr_t after = (uintptr_t)(work + specray_attention_split_scratch(rows, d[D_HEADS], d[D_KV_HEADS], d[D_HEAD_DIM], rows));
    w.quantised = (uint8_t*)((after + 63) & ~(uintptr_t)63);  // a row's blocks start on a cache line
    return w;
}

// Floats of scratch `specray_decoder_layers` needs (the caller allocates it).
int64_t specray_decoder_workspace(int64_t rows, const int64_t* d, int64_t max_keys) {
    int64_t sizes[7], total = 0, widest = d[D_HIDDEN];
    part_sizes(rows, d, max_keys, sizes);
    for (int i = 0; i < 7; i++) total += sizes[i];
    // a sequence has at most `rows` new tokens
    total += specray_attention_split_scratch(rows, d[D_HEADS], d[D_KV_HEADS], d[D_HEAD_DIM], rows);
    if (d[D_INTERMEDIATE] > widest) widest = d[D_INTERMEDIATE];
    if (d[D_HEADS] * d[D_HEAD_DIM] > widest) widest = d[D_HEADS] * d[D_HEAD_DIM];
    return total + (specray_fast_scratch_bytes(2 * rows, widest) + 63) / 4 + 1;  // 2: fast16's two parts
}

static void linear(const float* x, int64_t rows, int64_t in, int64_t address, int32_t kind, int64_t out,
                   float* y, uint8_t* quantised, int threads) {
    const uint8_t* blocks = (const uint8_t*)(intptr_t)address;
    if (kind >= KIND_FAST16)
        specray_fast16_linear(x, rows, in, blocks, kind - KIND_FAST16, out, y, quantised, threads);
    else if (kind >= KIND_FAST)
        specray_fast_linear(x, rows, in, blocks, kind - KIND_FAST, out, y, quantised, threads);
    else
        specray_exact_linear(x, rows, in, blocks, kind, out, y, threads);
}

// silu(g) * u, 16 at a time: g / (1 + e) for g >= 0, g e / (1 + e) below, e = exp(-|g|) <= 1 (libm's
// scalar expf was 4 % of a decode step). Every element by the same arithmetic, the tail padded.
static inline vec16 silu_mul16(vec16 g, vec16 u) {
    ivec16 negative = as_int(g) >> 31;  // the sign bit, not g < 0 (vec16.h: scalar code without AVX-512); -0 gives the same top
    vec16 e = exp16(as_float(as_int(g) | INT32_MIN));  // exp(-|g|): the sign bit set
    vec16 top = as_float((as_int(g * e) & negative) | (as_int(g) & ~negative));
    return top / (1.f + e) * u;
}

// act = silu(gate) * up, gate_up [rows, 2 * n] (gate first, as the fused weight stores them).
void specray_silu_mul(const float* gate_up, int64_t rows, int64_t n, float* act) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * n, *up = gate + n;
        int64_t i = 0;
        for (; i + LANES <= n; i += LANES) vstore(act + r * n + i, silu_mul16(vload(gate + i), vload(up + i)));
        if (i < n) {
            float g[LANES] = {0}, u[LANES] = {0}, out[LANES];
            memcpy(g, gate + i, (n - i) * sizeof(float));
            memcpy(u, up + i, (n - i) * sizeof(float));
            vstore(out, silu_mul16(vload(g), vload(u)));
            memcpy(act + r * n + i, out, (n - i) * sizeof(float));
        }
    }
}

// h [rows, hidden]: the embedded tokens in, the residual stream after the last layer out (before
// the final norm). weights [layers, W_COUNT] addresses; kinds [layers, 4] (KIND_*, per projection);
// kv: layer 0's [2 * kv_heads, num_slots, head_dim], layer l at kv + l * kv_layer_stride elements,
// fp32, or fp16 where kv_half.
// cos, sin [rows, head_dim]; slots [rows]; the attention rows as `specray_attention` takes them;
// work [specray_decoder_workspace(...)].
void specray_decoder_layers(float* h, int64_t rows, const int64_t* d, float eps, float scale,
                            const int64_t* weights, const int32_t* kinds, void* kv, int64_t kv_layer_stride,
                            int kv_half, int64_t num_slots, const float* cos, const float* sin, const int64_t* slots,
                            const int64_t* key_slots, const int64_t* key_start, const int64_t* num_ctx,
                            const int64_t* num_new, const int64_t* num_pad, const uint8_t* new_mask,
                            int64_t max_new, int64_t max_keys, float* work, int threads) {
    int64_t hidden = d[D_HIDDEN], heads = d[D_HEADS], kv_heads = d[D_KV_HEADS], dim = d[D_HEAD_DIM];
    int64_t inter = d[D_INTERMEDIATE], width = (heads + 2 * kv_heads) * dim;
    Workspace w = carve(work, rows, d, max_keys);
    specray_rms_norm(h, rows, hidden, (const float*)(intptr_t)weights[W_INPUT_NORM], eps, w.x);
    PHASES_START;
    for (int64_t l = 0; l < d[D_LAYERS]; l++) {
        const int64_t* lw = weights + l * W_COUNT;
        const int32_t* lk = kinds + l * 4;
        void* layer_kv = (char*)kv + l * kv_layer_stride * (kv_half ? 2 : 4);
        linear(w.x, rows, hidden, lw[W_QKV], lk[W_QKV], width, w.qkv, w.quantised, threads);
        PHASE(P_QKV);
        specray_rope_store_kv(w.qkv, rows, heads, kv_heads, dim, cos, sin, slots, layer_kv, num_slots, kv_half);
        PHASE(P_ROPE);
        (kv_half ? specray_attention_f16 : specray_attention)(w.qkv, width, rows, heads, kv_heads, dim, layer_kv,
                                                              num_slots, key_slots, key_start, num_ctx, num_new,
                                                              num_pad, new_mask, max_new, scale, w.attn, w.scores,
                                                              max_keys, threads);
        PHASE(P_ATTENTION);
        linear(w.attn, rows, heads * dim, lw[W_O], lk[W_O], hidden, w.delta, w.quantised, threads);
        PHASE(P_O);
        specray_add_rms_norm(h, w.delta, rows, hidden, (const float*)(intptr_t)lw[W_POST_NORM], eps, w.x);
        PHASE(P_POST_NORM);
        linear(w.x, rows, hidden, lw[W_GATE_UP], lk[W_GATE_UP], 2 * inter, w.gate_up, w.quantised, threads);
        PHASE(P_GATE_UP);
        specray_silu_mul(w.gate_up, rows, inter, w.act);
        PHASE(P_SILU);
        linear(w.act, rows, inter, lw[W_DOWN], lk[W_DOWN], hidden, w.delta, w.quantised, threads);
        PHASE(P_DOWN);
        if (l + 1 < d[D_LAYERS])
            specray_add_rms_norm(h, w.delta, rows, hidden, (const float*)(intptr_t)lw[W_COUNT + W_INPUT_NORM],
                                 eps, w.x);
        else
            for (int64_t i = 0; i < rows * hidden; i++) h[i] += w.delta[i];
        PHASE(P_NEXT_NORM);
    }
}

// Floats of scratch `specray_decoder_logits` needs for n rows of `hidden`.
int64_t specray_decoder_logits_workspace(int64_t n, int64_t hidden) {
    return n * hidden + (specray_fast_scratch_bytes(2 * n, hidden) + 63) / 4 + 16;  // 2: fast16's two parts
}

// A step's logits, after `specray_decoder_layers`: the final RMSNorm of the rows `picked` [n] of h
// [rows, hidden], then the head (packed blocks at `head`, of `kind` as in the weight table):
// logits [n, vocab]. With `normed` [rows, hidden] (else NULL), every row's norm goes there too (the
// features a feature-level draft reads) and the picked rows are copied from it. The same kernels,
// row for row, as the model's own norm and head calls.
void specray_decoder_logits(const float* h, int64_t rows, const int64_t* picked, int64_t n, int64_t hidden,
                            const float* norm, float eps, int64_t head, int32_t kind, int64_t vocab, float* logits,
                            float* normed, float* work, int threads) {
    float* x = work;  // [n, hidden]
    if (normed != NULL) {
        specray_rms_norm(h, rows, hidden, norm, eps, normed);
        for (int64_t i = 0; i < n; i++) memcpy(x + i * hidden, normed + picked[i] * hidden, hidden * sizeof(float));
    } else {
        for (int64_t i = 0; i < n; i++) specray_rms_norm(h + picked[i] * hidden, 1, hidden, norm, eps, x + i * hidden);
    }
    uint8_t* quantised = (uint8_t*)(((uintptr_t)(x + n * hidden) + 63) & ~(uintptr_t)63);
    linear(x, n, hidden, head, kind, vocab, logits, quantised, threads);
}
