// Attention on the CPU for every step: decode, verification chains and trees, prefill chunks.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kv_type.h"
#include "attention_scores.h"
#include "parallel.h"
#include "vec16.h"

#define MAX_GROUP 4  // query heads whose outputs share the value loads (GQA group, or a chunk of it)
#define TILE_ROWS 8  // rows of one sequence whose keys and values are read once for all of them
#define TILE_MIN_ROWS 32  // a sequence's rows a step from which they tile (a prefill chunk; fewer stay apart,
                          // as items enough to share among the threads)
#define VALUE_BLOCK 64  // keys whose values a tile's rows all weigh before the next block

// o[g] [dim] = sum_j p[g][j] * v_j over j0 <= j < n for g < num (p rows s_stride apart, o rows dim
// apart), added to o where `more` (a later block of the same sums: the same order, the partial sums
// kept exactly in fp32), with v_j = values + slot_j * dim, slot_j = head[j] for j < head_n, then
// tail[j - head_n]. Each value vector is loaded once for the whole group, and the outputs stay in
// registers (a load-add-store per key was a third of attention): 64 floats at a time on AVX-512; 16
// on AVX2, whose 16 registers spilled every accumulator of the 64-float version, so there each value
// row is read dim / 16 times from L1/L2.
static void weighted_values(const float* p, int64_t s_stride, int num, const kv_t* values, const int64_t* head,
                            int64_t head_n, const int64_t* tail, int64_t j0, int64_t n, int64_t dim, float* o,
                            int more) {
#define SLOT(j) ((j) < head_n ? head[j] : tail[(j) - head_n])
    int64_t d0 = 0;
#if defined(__AVX512F__)
    for (; d0 + 4 * LANES <= dim; d0 += 4 * LANES) {
        vec16 acc[MAX_GROUP][4] = {{{0}}};
        for (int g = 0; more && g < num; g++)
            for (int k = 0; k < 4; k++) acc[g][k] = vload(o + g * dim + d0 + k * LANES);
        for (int64_t j = j0; j < n; j++) {
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
        for (int g = 0; more && g < num; g++) {
            acc[g][0] = vload8(o + g * dim + d0);
            acc[g][1] = vload8(o + g * dim + d0 + 8);
        }
        for (int64_t j = j0; j < n; j++) {
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
            float acc = more ? o[g * dim + d0] : 0.f;
            for (int64_t j = j0; j < n; j++)  // fmaf: the same rounding however the compiler vectorises
                acc = fmaf(p[g * s_stride + j], kvf(values[SLOT(j) * dim + d0]), acc);
            o[g * dim + d0] = acc;
        }
#undef SLOT
}

// The first of a tile's rows (ascending key counts len[r]) that has a key at j or later.
static inline int first_row(const int64_t* len, int rows, int64_t j) {
    int r = 0;
    while (r < rows - 1 && len[r] <= j) r++;  // the last row always scores (its dummies included)
    return r;
}

// A tile: `rows` rows of one sequence (q at each row's group's first head, rows q_stride apart; o
// rows o_stride apart), `num` query heads each (dim apart) that share one KV head, over the row's
// keys: the first `ctx` all visible, the next n - ctx where its mask (visible_new + r * max_new)
// says, then (a tile of one row only) `pad` dummy keys that are scored and dropped. Each row's
// visible keys begin with the row before's (a prefill chunk or a chain; a tree path), so the tile
// reads each key and value once for all its rows instead of once a row. s [rows * num, s_stride >=
// the last row's keys + pad] scratch.
// A row's keys are its context, then its visible new keys in order (masked ones are left out, not
// zeroed), then the dummies; every key is scored by the same arithmetic wherever it falls (a last
// partial block is padded and cut; a key's lane never mixes with another's), and its values are
// summed in key order whatever the tile. So a row's numbers depend on its visible keys alone: a
// verification row (chain or tree node), a prefill row and the decode row of the same tokens agree
// bit for bit (the fast kernel mode's exactness rests on it).
static void attend(const float* q, int64_t q_stride, int rows, int num, const kv_t* keys, const kv_t* values,
                   const int64_t* slots, int64_t ctx, int64_t n, int64_t pad, const uint8_t* visible_new,
                   int64_t max_new, int64_t dim, float scale, float* s, int64_t s_stride, float* o,
                   int64_t o_stride) {
    const uint8_t* last = visible_new + (rows - 1) * max_new;
    int64_t seen[n - ctx + 1], m = 0, len[TILE_ROWS];  // the last row's visible new keys' slots; each row's keys
    for (int64_t j = ctx; j < n; j++)
        if (last[j - ctx]) seen[m++] = slots[j];
    for (int r = 0; r < rows; r++) {
        len[r] = ctx;
        for (int64_t j = 0; j < n - ctx; j++) len[r] += visible_new[r * max_new + j] != 0;
    }
    const int64_t total = ctx + m, all = total + pad;
#define KEY_SLOT(i) ((i) < ctx ? slots[i] : (i) < total ? seen[(i) - ctx] : slots[n + (i) - total])
#define SCORED(r) ((r) == rows - 1 ? all : len[r])
#define ROW_SCORES(r, g) (s + ((r) * num + (g)) * s_stride)
    int64_t j = 0;
#if defined(__AVX512F__)
    if (dim % LANES == 0)  // 16 keys at a time, in L1 for every head and row of the tile
        for (; j < all; j += LANES) {
            int64_t block[LANES];
            for (int k = 0; k < LANES; k++) block[k] = j + k < all ? KEY_SLOT(j + k) : KEY_SLOT(0);
            for (int r = first_row(len, rows, j); r < rows; r++) {  // the rows that score this block
                int64_t k_n = SCORED(r) - j < LANES ? SCORED(r) - j : LANES;
                for (int g = 0; g < num; g++) {
                    vec16 sv = scale * dot16(q + r * q_stride + g * dim, keys, block, dim);
                    store_scores(ROW_SCORES(r, g) + j, sv, k_n);
                }
            }
        }
#else
    if (dim % 8 == 0)  // 8 keys at a time, in L1 for every head and row of the tile
        for (; j < all; j += 8) {
            int64_t block[8];
            for (int k = 0; k < 8; k++) block[k] = j + k < all ? KEY_SLOT(j + k) : KEY_SLOT(0);
            for (int r = first_row(len, rows, j); r < rows; r++) {
                int64_t k_n = SCORED(r) - j < 8 ? SCORED(r) - j : 8;
                for (int g = 0; g < num; g++) {
                    vec8 sv = scale * dot8(q + r * q_stride + g * dim, keys, block, dim);
                    store_scores8(ROW_SCORES(r, g) + j, sv, k_n);
                }
            }
        }
#endif
    for (; j < all; j++)  // other head sizes: one key at a time (dummies too, so the work stays)
        for (int r = first_row(len, rows, j); r < rows; r++)
            for (int g = 0; g < num; g++)
                ROW_SCORES(r, g)[j] = scale * kv_dot(q + r * q_stride + g * dim, keys + KEY_SLOT(j) * dim, dim);
#undef KEY_SLOT
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < num; g++) softmax(ROW_SCORES(r, g), len[r]);
    // each block of values in L1 for every row that sums it (one row: all its keys in one pass)
    const int64_t step = rows > 1 ? VALUE_BLOCK : total > 0 ? total : 1;
    for (int64_t j0 = 0; j0 == 0 || j0 < total; j0 += step)
        for (int r = j0 == 0 ? 0 : first_row(len, rows, j0); r < rows; r++) {  // j0 = 0: every row, keys or not
            int64_t j1 = j0 + step < len[r] ? j0 + step : len[r];
            weighted_values(ROW_SCORES(r, 0), s_stride, num, values, slots, ctx, seen, j0, j1, dim, o + r * o_stride,
                            j0 > 0);
        }
#undef SCORED
#undef ROW_SCORES
}

#define SCORE_THREADS 16  // score buffers: one per thread (more threads are capped), not one per row

// A thread's score rows: an item's, a tile's rows x the query heads of one KV head it takes.
static inline int64_t score_rows(int64_t group) { return TILE_ROWS * (group < MAX_GROUP ? group : MAX_GROUP); }

#if !defined(KV_HALF)  // once in the library: attention_f16.c includes this file again
// Floats of score scratch `specray_attention` needs (`group` query heads a KV head, rows of up to max_keys keys).
int64_t specray_attention_score_floats(int64_t group, int64_t max_keys) {
    return SCORE_THREADS * score_rows(group) * max_keys;
}
#endif

// Floats of the caller's scratch that hold a step's task and tile indices (int64), kept off the
// stack: a long unchunked prefill has ~100k rows.
static inline int64_t attention_index_floats(int64_t rows, int64_t group) {
    return 2 * (3 * (rows * group + 1) + 2 * (rows + 1)) + 2;  // + 2: room to align them to 8 bytes
}

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
    const int64_t *tile_t0, *tile_rows;
    const int64_t *task_t0, *task_v0, *task_num;
    int64_t per_task;
    float* split_scratch;
} AttentionJob;

// Items [i0, i1) of (tile, chunk c of KV head c / chunks's group), on thread `thread`'s scores.
static void row_chunk(void* ctx, int64_t i0, int64_t i1, int thread, int fresh) {
    (void)fresh;
    const AttentionJob* j = (const AttentionJob*)ctx;
    float* scores = j->scratch + thread * score_rows(j->group) * j->max_keys;
    for (int64_t i = i0; i < i1; i++) {
        int64_t k = i / (j->kv_heads * j->chunks), c = i % (j->kv_heads * j->chunks), t = j->tile_t0[k];
        int64_t kvh = c / j->chunks, first = (c % j->chunks) * MAX_GROUP, h = kvh * j->group + first;
        int num = (int)(j->group - first < MAX_GROUP ? j->group - first : MAX_GROUP);
        attend(j->q + t * j->q_stride + h * j->dim, j->q_stride, (int)j->tile_rows[k], num,
               j->kv + kvh * j->num_slots * j->dim, j->kv + (j->kv_heads + kvh) * j->num_slots * j->dim,
               j->key_slots + j->key_start[t], j->num_ctx[t], j->num_ctx[t] + j->num_new[t], j->num_pad[t],
               j->new_mask + t * j->max_new, j->max_new, j->dim, j->scale, scores, j->max_keys,
               j->out + (t * j->heads + h) * j->dim, j->heads * j->dim);
    }
}

// Whether row b's visible new keys (mask b [n]) begin with row a's: a's within b's, b's others after a's last.
static int extends(const uint8_t* a, const uint8_t* b, int64_t n) {
    int64_t last = -1;
    for (int64_t j = 0; j < n; j++) {
        if (a[j] && !b[j]) return 0;
        if (a[j]) last = j;
    }
    for (int64_t j = 0; j < last; j++)
        if (b[j] && !a[j]) return 0;
    return 1;
}

// The tiles of a sequence's rows t0 .. t0 + n - 1 (not split) into tile_t0 / tile_rows from *tiles on:
// runs of up to TILE_ROWS rows, each extending the one before, where the sequence has TILE_MIN_ROWS
// rows or more (a prefill chunk); else a row a tile.
static void tile_rows(int64_t t0, int64_t n, int64_t pad, const uint8_t* new_mask, int64_t max_new, int64_t* tile_t0,
                      int64_t* tile_n, int64_t* tiles) {
    int tile = n >= TILE_MIN_ROWS && pad == 0;
    for (int64_t t = t0; t < t0 + n;) {
        int64_t r = 1;
        while (tile && r < TILE_ROWS && t + r < t0 + n &&
               extends(new_mask + (t + r - 1) * max_new, new_mask + (t + r) * max_new, n))
            r++;
        tile_t0[*tiles] = t;
        tile_n[(*tiles)++] = r;
        t += r;
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
// (1 = visible); out [rows, heads * dim]; scratch [specray_attention_score_floats + the split's].
// A prefill chunk's rows go in tiles that read each key and value once for all of them.
// Sequences of specray_split_min_rows to _max_rows rows after specray_split_min_ctx context or more split (hybrid path).
void KV_NAME(specray_attention)(const float* q, int64_t q_stride, int64_t rows, int64_t heads, int64_t kv_heads,
                       int64_t dim, const kv_t* kv, int64_t num_slots, const int64_t* key_slots,
                       const int64_t* key_start, const int64_t* num_ctx, const int64_t* num_new,
                       const int64_t* num_pad, const uint8_t* new_mask, int64_t max_new, float scale,
                       float* out, float* scratch, int64_t max_keys, int threads) {
    int64_t group = heads / kv_heads, chunks = (group + MAX_GROUP - 1) / MAX_GROUP;
    int64_t work = rows * heads * max_keys * dim;
    // split tasks: (sequence start row, vector tile) per KV head; other rows go the per-row way
    float* indices = scratch + SCORE_THREADS * score_rows(group) * max_keys;  // the split's part starts with them
    int64_t* index = (int64_t*)(((uintptr_t)indices + 7) & ~(uintptr_t)7);
    int64_t *task_t0 = index, *task_v0 = task_t0 + rows * group + 1, *task_num = task_v0 + rows * group + 1;
    int64_t *tile_t0 = task_num + rows * group + 1, *tile_n = tile_t0 + rows + 1;  // the other rows' tiles
    int64_t tasks = 0, tiles = 0;
    for (int64_t t = 0; t < rows;) {
        int64_t n = num_new[t], m = n * group;
        int split = n >= specray_split_min_rows && n <= specray_split_max_rows && num_pad[t] == 0 &&
                    num_ctx[t] >= specray_split_min_ctx && num_ctx[t] > 0;
        if (!split) tile_rows(t, n, num_pad[t], new_mask, max_new, tile_t0, tile_n, &tiles);
        int64_t parts = (m + SPLIT_TILE - 1) / SPLIT_TILE, size = (m + parts - 1) / parts;  // even parts
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
                        num_pad, new_mask, max_new, scale, out, scratch, max_keys, group, chunks, tile_t0, tile_n,
                        task_t0, task_v0, task_num, per_task,
                        indices + attention_index_floats(rows, group)};  // the caller sizes scratch for all three
    specray_parallel(tiles * kv_heads * chunks, 1, threads, row_chunk, &job);
    specray_parallel(tasks * kv_heads, 1, threads, split_chunk, &job);
}
