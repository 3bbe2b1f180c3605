// Attention for steps of short sequences on the CPU (decode, verification chains and trees).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kv_type.h"
#include "parallel.h"
#include "vec16.h"

#define MAX_GROUP 4  // query heads whose outputs share the value loads (GQA group, or a chunk of it)

// o[g] [dim] = sum_j p[g][j] * v_j for g < num (p rows s_stride apart, o rows dim apart), with
// v_j = values + slot_j * dim, slot_j = head[j] for j < head_n, then tail[j - head_n]. Each value
// vector is loaded once for the whole group, and the outputs stay in registers (a load-add-store per key was a third of attention): 64 floats at a
// time on AVX-512; 16 on AVX2, whose 16 registers spilled every accumulator of the 64-float
// version, so there each value row is read dim / 16 times from L1/L2.
static void weighted_values(const float* p, int64_t s_stride, int num, const kv_t* values, const int64_t* head,
                            int64_t head_n, const int64_t* tail, int64_t n, int64_t dim, float* o) {
#define SLOT(j) ((j) < head_n ? head[j] : tail[(j) - head_n])
    int64_t d0 = 0;
#if defined(__AVX512F__)
    for (; d0 + 4 * LANES <= dim; d0 += 4 * LANES) {
        vec16 acc[MAX_GROUP][4] = {{{0}}};
        for (int64_t j = 0; j < n; j++) {
            const kv_t* v = values + SLOT(j) * dim + d0;
            vec16 vj[4] = {kvload(v), kvload(v + LANES), kvload(v + 2 * LANES), kvload(v + 3 * LANES)};
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
            const kv_t* v = values + SLOT(j) * dim + d0;
            vec8 v0 = kvload8(v), v1 = kvload8(v + 8);
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
            for (int64_t j = 0; j < n; j++)  // fmaf: the same rounding however the compiler vectorises
                acc = fmaf(p[g * s_stride + j], kvf(values[SLOT(j) * dim + d0]), acc);
            o[g * dim + d0] = acc;
        }
#undef SLOT
}

// The dot products of q [dim] with 16 keys (dim % 16 == 0) as one vector, lane k for key k. Each
// key's 16 partial sums are folded with the other keys' (a transpose-and-add, 31 shuffles for the
// 16 keys) instead of reduced one key at a time (about 5 shuffles and 3 scalar adds each).
static inline vec16 dot16(const float* q, const kv_t* keys, const int64_t* slots, int64_t dim) {
    vec16 acc[16];
    for (int k = 0; k < 16; k++) {
        const kv_t* key = keys + slots[k] * dim;
        acc[k] = vload(q) * kvload(key);
        for (int64_t i = LANES; i < dim; i += LANES) acc[k] += vload(q + i) * kvload(key + i);
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
static inline vec8 dot8(const float* q, const kv_t* keys, const int64_t* slots, int64_t dim) {
    vec8 acc[8];
    for (int k = 0; k < 8; k++) {
        const kv_t* key = keys + slots[k] * dim;
        acc[k] = vload8(q) * kvload8(key);
        for (int64_t i = 8; i < dim; i += 8) acc[k] += vload8(q + i) * kvload8(key + i);
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

// `num` query heads (q rows dim apart) that share one KV head, over their sequence's keys: the
// first `ctx` all visible, the next n - ctx where visible_new says, then `pad` dummy keys that are
// scored and dropped. s [num, s_stride >= n + pad] scratch; o [num, dim] out.
// A row's keys are its context, then its visible new keys in order (masked ones are left out, not
// zeroed), then the dummies; every key is scored by the same arithmetic wherever it falls (a last
// partial block is padded with repeats and cut). So a row's numbers depend on its visible keys
// alone: a verification row (chain or tree node), a prefill row and the decode row of the same
// tokens agree bit for bit (the fast kernel mode's exactness rests on it).
static void attend(const float* q, int num, const kv_t* keys, const kv_t* values, const int64_t* slots,
                   int64_t ctx, int64_t n, int64_t pad, const uint8_t* visible_new, int64_t dim,
                   float scale, float* s, int64_t s_stride, float* o) {
    int64_t seen[n - ctx + 1], m = 0;  // the visible new keys' slots
    for (int64_t j = ctx; j < n; j++)
        if (visible_new[j - ctx]) seen[m++] = slots[j];
    const int64_t total = ctx + m, all = total + pad;
#define KEY_SLOT(i) ((i) < ctx ? slots[i] : (i) < total ? seen[(i) - ctx] : slots[n + (i) - total])
    int64_t j = 0;
#if defined(__AVX512F__)
    if (dim % LANES == 0)  // 16 keys at a time, in L1 for every head of the group
        for (; j < all; j += LANES) {
            int64_t block[LANES], k_n = all - j < LANES ? all - j : LANES;
            for (int k = 0; k < LANES; k++) block[k] = k < k_n ? KEY_SLOT(j + k) : KEY_SLOT(0);
            for (int g = 0; g < num; g++) {
                float sv[LANES];
                vstore(sv, scale * dot16(q + g * dim, keys, block, dim));
                memcpy(s + g * s_stride + j, sv, k_n * sizeof(float));
            }
        }
#else
    if (dim % 8 == 0)  // 8 keys at a time, in L1 for every head of the group
        for (; j < all; j += 8) {
            int64_t block[8], k_n = all - j < 8 ? all - j : 8;
            for (int k = 0; k < 8; k++) block[k] = k < k_n ? KEY_SLOT(j + k) : KEY_SLOT(0);
            for (int g = 0; g < num; g++) {
                float sv[8];
                vstore8(sv, scale * dot8(q + g * dim, keys, block, dim));
                memcpy(s + g * s_stride + j, sv, k_n * sizeof(float));
            }
        }
#endif
    for (; j < all; j++)  // other head sizes: one key at a time (dummies too, so the work stays)
        for (int g = 0; g < num; g++) s[g * s_stride + j] = scale * kv_dot(q + g * dim, keys + KEY_SLOT(j) * dim, dim);
#undef KEY_SLOT
    for (int g = 0; g < num; g++) softmax(s + g * s_stride, total);
    weighted_values(s, s_stride, num, values, slots, ctx, seen, total, dim, o);
}

#define SCORE_THREADS 16  // score buffers: one per thread (more threads are capped), not one per row

#if !defined(KV_HALF)  // once in the library: attention_f16.c includes this file again
// Rows' worth of score scratch `specray_attention` needs (times heads * max_keys).
int64_t specray_attention_score_rows(void) { return SCORE_THREADS; }
#endif

#include "attention_hybrid.h"

typedef struct {  // specray_attention's arguments, as specray_parallel's chunks see them
    const float* q;
    int64_t q_stride, heads, kv_heads, dim;
    const kv_t* kv;
    int64_t num_slots;
    const int64_t *key_slots, *key_start, *num_ctx, *num_new, *num_pad;
    const uint8_t* new_mask;
    int64_t max_new;
    float scale;
    float *out, *scratch;
    int64_t max_keys, group, chunks;
    const uint8_t* split_row;
    const int64_t *task_t0, *task_v0, *task_num;
    int64_t per_task;
    float* split_scratch;
} AttentionJob;

// Items [i0, i1) of (row, chunk c of KV head c / chunks's group), on thread `thread`'s scores.
static void row_chunk(void* ctx, int64_t i0, int64_t i1, int thread, int fresh) {
    (void)fresh;
    const AttentionJob* j = (const AttentionJob*)ctx;
    float* scores = j->scratch + thread * j->heads * j->max_keys;
    for (int64_t i = i0; i < i1; i++) {
        int64_t t = i / (j->kv_heads * j->chunks), c = i % (j->kv_heads * j->chunks);
        if (j->split_row[t]) continue;
        int64_t kvh = c / j->chunks, first = (c % j->chunks) * MAX_GROUP, h = kvh * j->group + first;
        int num = (int)(j->group - first < MAX_GROUP ? j->group - first : MAX_GROUP);
        attend(j->q + t * j->q_stride + h * j->dim, num, j->kv + kvh * j->num_slots * j->dim,
               j->kv + (j->kv_heads + kvh) * j->num_slots * j->dim, j->key_slots + j->key_start[t], j->num_ctx[t],
               j->num_ctx[t] + j->num_new[t], j->num_pad[t], j->new_mask + t * j->max_new, j->dim, j->scale,
               scores + h * j->max_keys, j->max_keys, j->out + (t * j->heads + h) * j->dim);
    }
}

// Items [i0, i1) of (split task, KV head).
static void split_chunk(void* ctx, int64_t i0, int64_t i1, int thread, int fresh) {
    (void)thread, (void)fresh;
    const AttentionJob* j = (const AttentionJob*)ctx;
    for (int64_t i = i0; i < i1; i++) {
        int64_t k = i / j->kv_heads, kvh = i % j->kv_heads;
        int64_t t = j->task_t0[k], n = j->num_new[t], v0 = j->task_v0[k];
        split_task(j->q, j->q_stride, j->heads, j->group, kvh, j->dim, j->kv + kvh * j->num_slots * j->dim,
                   j->kv + (j->kv_heads + kvh) * j->num_slots * j->dim, j->key_slots + j->key_start[t], j->num_ctx[t],
                   n, j->new_mask, j->max_new, t, v0, (int)j->task_num[k], j->scale, j->out,
                   j->split_scratch + (k * j->kv_heads + kvh) * j->per_task);
    }
}

// Attention for a step of short sequences (decode, verification chains and trees), each query row
// over its own sequence's keys only: its context (all visible) and the new tokens `new_mask` marks
// (its ancestry). q rows have stride q_stride floats, heads of `dim`; kv [2 * kv_heads, num_slots,
// dim] (keys then values); key_slots [num_keys]; per row: key_start (its sequence's first key in
// key_slots), num_ctx, num_pad (the padded baseline's masked dummy keys after the sequence's
// num_new keys: scored, then dropped, as a padded kernel would); new_mask [rows, max_new]
// (1 = visible); out [rows, heads * dim]; scratch [SCORE_THREADS * heads * max_keys + the split's].
// Sequences of specray_split_min_rows+ rows after specray_split_min_ctx context or more split (hybrid path).
void KV_NAME(specray_attention)(const float* q, int64_t q_stride, int64_t rows, int64_t heads, int64_t kv_heads,
                       int64_t dim, const kv_t* kv, int64_t num_slots, const int64_t* key_slots,
                       const int64_t* key_start, const int64_t* num_ctx, const int64_t* num_new,
                       const int64_t* num_pad, const uint8_t* new_mask, int64_t max_new, float scale,
                       float* out, float* scratch, int64_t max_keys, int threads) {
    int64_t group = heads / kv_heads, chunks = (group + MAX_GROUP - 1) / MAX_GROUP;
    int64_t work = rows * heads * max_keys * dim;
    // split tasks: (sequence start row, vector tile) per KV head; other rows go the per-row way
    int64_t task_t0[rows * group + 1], task_v0[rows * group + 1], task_num[rows * group + 1];
    uint8_t split_row[rows];
    int64_t tasks = 0;
    for (int64_t t = 0; t < rows;) {
        int64_t n = num_new[t], m = n * group;
        int split = n >= specray_split_min_rows && num_pad[t] == 0 && num_ctx[t] >= specray_split_min_ctx &&
                    num_ctx[t] > 0;
        for (int64_t i = 0; i < n; i++) split_row[t + i] = (uint8_t)split;
        int64_t tiles = (m + SPLIT_TILE - 1) / SPLIT_TILE, size = (m + tiles - 1) / tiles;  // even tiles
        for (int64_t v0 = 0; split && v0 < m; v0 += size) {
            task_t0[tasks] = t;
            task_v0[tasks] = v0;
            task_num[tasks++] = m - v0 < size ? m - v0 : size;
        }
        t += n;
    }
    int64_t per_task = SPLIT_TILE * SPLIT_BLOCK + MAX_GROUP * dim + max_new;
    if (threads > SCORE_THREADS) threads = SCORE_THREADS;
    // one thread for tiny steps only: a decode row past ~60 keys reads its KV from memory, faster on two
    if (work <= (1 << 15)) threads = 1;
    AttentionJob job = {q, q_stride, heads, kv_heads, dim, kv, num_slots, key_slots, key_start, num_ctx, num_new,
                        num_pad, new_mask, max_new, scale, out, scratch, max_keys, group, chunks, split_row,
                        task_t0, task_v0, task_num, per_task,
                        scratch + SCORE_THREADS * heads * max_keys};  // the caller sizes scratch for both
    specray_parallel(rows * kv_heads * chunks, 1, threads, row_chunk, &job);
    specray_parallel(tasks * kv_heads, 1, threads, split_chunk, &job);
}
