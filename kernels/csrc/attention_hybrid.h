// Hybrid tree attention (LongSpec) for attention.c, which includes it once per KV type: the prefix
// part and the tree part, merged by log-sum-exp. A sequence's rows all see its whole context
// unmasked, so the context keys and values are read once per tile of query vectors (rows x heads of
// one KV head) instead of once per row; the tree part (the round's own keys, masked by ancestry) is
// small. Exact up to float rounding.

#define SPLIT_TILE 8   // query vectors sharing one pass over the context
#define SPLIT_BLOCK 256 // context keys scored per block (their keys and values stay in L2)

// Which sequences split (HybridSplit sets them); one set for attention.c and attention_f16.c.
// Per thread: the caller sets them right before its call, and a target (never split: a split row's
// bits differ from a one-row step's) and a draft (split) may step on two threads of one process.
extern _Thread_local int64_t specray_split_min_ctx, specray_split_min_rows, specray_split_max_rows;

#if !defined(KV_HALF)  // once in the library: attention_f16.c includes attention.c again
_Thread_local int64_t specray_split_min_ctx = 2048, specray_split_min_rows = 3, specray_split_max_rows = 16;

void specray_set_attention_split(int64_t min_ctx, int64_t min_rows, int64_t max_rows) {
    specray_split_min_ctx = min_ctx;
    specray_split_min_rows = min_rows < 2 ? 2 : min_rows;
    specray_split_max_rows = max_rows;
}
#endif

// Online softmax over the context for `num` query vectors (qs[i] [dim]): o[i] [dim] the normalised
// output, lse[i] its log-sum-exp. s [num * SPLIT_BLOCK], part [MAX_GROUP * dim] scratch.
static void attend_prefix(const float* const* qs, int num, const kv_t* keys, const kv_t* values,
                          const int64_t* slots, int64_t ctx, int64_t dim, float scale, float* s, float* part,
                          float* const* o, float* lse) {
    float top[SPLIT_TILE], total[SPLIT_TILE];
    for (int i = 0; i < num; i++) {
        top[i] = -INFINITY;
        total[i] = 0.f;
        memset(o[i], 0, dim * sizeof(float));
    }
    for (int64_t j0 = 0; j0 < ctx; j0 += SPLIT_BLOCK) {
        int64_t nb = ctx - j0 < SPLIT_BLOCK ? ctx - j0 : SPLIT_BLOCK, j = 0;
#if defined(__AVX512F__)
        if (dim % LANES == 0)
            for (; j + LANES <= nb; j += LANES)
                for (int i = 0; i < num; i++) vstore(s + i * SPLIT_BLOCK + j, scale * dot16(qs[i], keys, slots + j0 + j, dim));
#else
        if (dim % 8 == 0)
            for (; j + 8 <= nb; j += 8)
                for (int i = 0; i < num; i++) vstore8(s + i * SPLIT_BLOCK + j, scale * dot8(qs[i], keys, slots + j0 + j, dim));
#endif
        for (; j < nb; j++)
            for (int i = 0; i < num; i++) s[i * SPLIT_BLOCK + j] = scale * kv_dot(qs[i], keys + slots[j0 + j] * dim, dim);
        for (int i = 0; i < num; i++) {  // rescale the running sums to the new maximum, exponentiate the block
            float* si = s + i * SPLIT_BLOCK, m = top[i];
            for (j = 0; j < nb; j++) m = si[j] > m ? si[j] : m;
            if (m > top[i]) {
                float shrink = expf(top[i] - m);  // top = -inf on the first block: 0, and o is 0 anyway
                for (int64_t d = 0; d < dim; d++) o[i][d] *= shrink;
                total[i] *= shrink;
                top[i] = m;
            }
            vec16 totals = {0};
            for (j = 0; j + LANES <= nb; j += LANES) {
                vec16 e = exp16(vload(si + j) - m);
                vstore(si + j, e);
                totals += e;
            }
            total[i] += hsum(totals);
            for (; j < nb; j++) {
                si[j] = expf(si[j] - m);
                total[i] += si[j];
            }
        }
        for (int i0 = 0; i0 < num; i0 += MAX_GROUP) {  // each value row once per MAX_GROUP vectors
            int g = num - i0 < MAX_GROUP ? num - i0 : MAX_GROUP;
            weighted_values(s + i0 * SPLIT_BLOCK, SPLIT_BLOCK, g, values, slots + j0, nb, NULL, 0, nb, dim, part, 0);
            for (int i = 0; i < g; i++)
                for (int64_t d = 0; d < dim; d++) o[i0 + i][d] += part[i * dim + d];
        }
    }
    for (int i = 0; i < num; i++) {
        float inv = 1.f / total[i];
        for (int64_t d = 0; d < dim; d++) o[i][d] *= inv;
        lse[i] = top[i] + logf(total[i]);
    }
}

// The tree part of one query vector (its visible new keys), merged into o (the prefix part, lse_prefix)
// with weight sigmoid(lse_prefix - lse_tree). s [n] scratch.
static void attend_tree_merge(const float* q, const kv_t* keys, const kv_t* values, const int64_t* slots,
                              int64_t n, const uint8_t* visible, int64_t dim, float scale, float lse_prefix,
                              float* s, float* o) {
    float top = -INFINITY, total = 0.f;
    for (int64_t j = 0; j < n; j++) {
        s[j] = visible[j] ? scale * kv_dot(q, keys + slots[j] * dim, dim) : -INFINITY;
        top = s[j] > top ? s[j] : top;
    }
    for (int64_t j = 0; j < n; j++) {
        s[j] = s[j] == -INFINITY ? 0.f : expf(s[j] - top);
        total += s[j];
    }
    float lse_tree = top + logf(total);
    float w = 1.f / (1.f + expf(lse_tree - lse_prefix));  // the prefix part's share
    float wt = (1.f - w) / total;
    for (int64_t d = 0; d < dim; d++) {
        float acc = 0.f;
        for (int64_t j = 0; j < n; j++) acc += s[j] * kvf(values[slots[j] * dim + d]);
        o[d] = w * o[d] + wt * acc;
    }
}

// One split task: query vectors v0..v0+num-1 of a sequence whose rows start at t0, for KV head kvh
// (vector v = row t0 + v / group, head kvh * group + v % group). scratch [SPLIT_TILE * SPLIT_BLOCK +
// MAX_GROUP * dim + n_new] floats; lse [SPLIT_TILE].
static void split_task(const float* q, int64_t q_stride, int64_t heads, int64_t group, int64_t kvh, int64_t dim,
                       const kv_t* keys, const kv_t* values, const int64_t* slots, int64_t ctx, int64_t n_new,
                       const uint8_t* new_mask, int64_t max_new, int64_t t0, int64_t v0, int num, float scale,
                       float* out, float* scratch) {
    const float* qs[SPLIT_TILE];
    float* os[SPLIT_TILE];
    float lse[SPLIT_TILE];
    for (int i = 0; i < num; i++) {
        int64_t t = t0 + (v0 + i) / group, h = kvh * group + (v0 + i) % group;
        qs[i] = q + t * q_stride + h * dim;
        os[i] = out + (t * heads + h) * dim;
    }
    float *s = scratch, *part = scratch + SPLIT_TILE * SPLIT_BLOCK, *tree = part + MAX_GROUP * dim;
    attend_prefix(qs, num, keys, values, slots, ctx, dim, scale, s, part, os, lse);
    for (int i = 0; i < num; i++) {
        int64_t t = t0 + (v0 + i) / group;
        attend_tree_merge(qs[i], keys, values, slots + ctx, n_new, new_mask + t * max_new, dim, scale, lse[i],
                          tree, os[i]);
    }
}

#if !defined(KV_HALF)
// Floats of scratch `specray_attention` needs beyond rows * heads * max_keys (the split tasks').
int64_t specray_attention_split_scratch(int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, int64_t max_new) {
    int64_t group = heads / kv_heads;
    int64_t tasks = (rows * group + SPLIT_TILE - 1) / SPLIT_TILE + rows;  // at most one partial tile per sequence
    return attention_index_floats(rows, group) + tasks * kv_heads * (SPLIT_TILE * SPLIT_BLOCK + MAX_GROUP * dim + max_new);
}
#endif
