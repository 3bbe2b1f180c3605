// y = x @ W^T for weights stored exactly as blocks of 32: GGUF Q4_1 / Q8_0, or plain fp32, bf16 or
// fp16 values (a Hugging Face checkpoint's).
//
// Why: a batch-1 decode step streams every weight once, so bytes read bound its speed. The
// blocks hold the same values as the fp32 tensor (checked bit for bit when packing) in 24, 36, 64
// or 128 bytes per 32 weights; x stays fp32 (no activation quantisation).
// Each block is widened to fp32 in registers (w = d * q + m, exact in fp32 since d * q is) and used
// for every row of x. Each row's arithmetic is the same whatever the number of rows or threads, so a
// k-row verification step and a 1-row decode step give bit-identical outputs for the same input.
#include <stdint.h>
#include <math.h>
#include <string.h>

#include "parallel.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define QK 32         // weights per block
// d and m are GGUF's fp16 scales widened to fp32: a broadcast from memory then costs no shuffle,
// which is the kernel's bottleneck port (4 more bytes per block, measured faster).
#define Q4_1_BYTES 24 // fp32 d, fp32 m, 16 bytes of nibbles (element j low, j + 16 high)
#define Q8_0_BYTES 36 // fp32 d, 32 int8
#define F32_BYTES 128 // 32 fp32 values (the weight tensor itself)
#define B16_BYTES 64  // 32 bf16 or fp16 values
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096  // how far ahead of the weight stream
#endif
// One core keeps too few misses in flight to stream at full bandwidth; software prefetch into L2
// took the whole SmolLM2 step's GEMVs from 11.5 to 7.5-8.5 ms (2-core box; 2-8 KiB ahead alike).
#define PREFETCH(p) __builtin_prefetch((p), 0, 2)
#define ROW_CHUNK 8   // rows whose accumulators stay in registers (AVX-512: 32 of them)

static inline float load_f32(const uint8_t* p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

// -- vectors: VL floats each, NV per block ----------------------------------------------------
#if defined(__AVX512F__)
typedef __m512 vf;
#define VL 16
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSET(s) _mm512_set1_ps(s)
static inline vf i8_to_vf(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vf;
#define VL 8
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VSET(s) _mm256_set1_ps(s)
static inline float vsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
typedef float vf;
#define VL 1
#define VZERO() 0.f
#define VLOAD(p) (*(p))
#define VADD(a, b) ((a) + (b))
#define VFMA(a, b, c) fmaf(a, b, c)
#define VSET(s) (s)
static inline float vsum(vf v) { return v; }
#endif
#define NV (QK / VL)

// w [NV]: the block's 32 weights in element order.
static inline void dequant_q4_1(const uint8_t* blk, vf w[NV]) {
    float d = load_f32(blk), m = load_f32(blk + 4);
    const uint8_t* qs = blk + 8;
#if VL == 16
    // The block's 16 possible values as a table (exact: d * k is), looked up by nibble: vpermps
    // reads only an index's low 4 bits, so no masking, and no int-to-float conversion per weight.
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = _mm512_fmadd_ps(VSET(d), iota, VSET(m));
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)qs));
    w[0] = _mm512_permutexvar_ps(bytes, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
#elif VL == 8
    __m128i raw = _mm_loadu_si128((const __m128i*)qs), low4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int j = 0; j < 4; j++)
        w[j] = VFMA(VSET(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j])), VSET(m));
#else
    for (int j = 0; j < 16; j++) {
        w[j] = fmaf(d, (float)(qs[j] & 0x0f), m);
        w[j + 16] = fmaf(d, (float)(qs[j] >> 4), m);
    }
#endif
}

static inline void dequant_q8_0(const uint8_t* blk, vf w[NV]) {
    float d = load_f32(blk);
    const uint8_t* qs = blk + 4;
#if VL == 16
    w[0] = _mm512_mul_ps(VSET(d), i8_to_vf(qs));
    w[1] = _mm512_mul_ps(VSET(d), i8_to_vf(qs + 16));
#elif VL == 8
    for (int j = 0; j < 4; j++)
        w[j] = _mm256_mul_ps(VSET(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(qs + 8 * j)))));
#else
    for (int j = 0; j < QK; j++) w[j] = d * (float)(int8_t)qs[j];
#endif
}

static inline void dequant_f32(const uint8_t* blk, vf w[NV]) {
    for (int j = 0; j < NV; j++) w[j] = VLOAD((const float*)blk + j * VL);
}

// bf16 is fp32's upper half: widening is a shift.
static inline void dequant_bf16(const uint8_t* blk, vf w[NV]) {
#if VL == 16
    for (int j = 0; j < NV; j++)
        w[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(blk + 32 * j))), 16));
#elif VL == 8
    for (int j = 0; j < NV; j++)
        w[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(blk + 16 * j))), 16));
#else
    for (int j = 0; j < QK; j++) {
        uint32_t bits = (uint32_t)(blk[2 * j] | blk[2 * j + 1] << 8) << 16;
        memcpy(&w[j], &bits, 4);
    }
#endif
}

static inline void dequant_f16(const uint8_t* blk, vf w[NV]) {
#if VL == 16
    for (int j = 0; j < NV; j++) w[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + 32 * j)));
#elif VL == 8 && defined(__F16C__)
    for (int j = 0; j < NV; j++) w[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + 16 * j)));
#else  // the compiler's _Float16 widening, as kv_type.h's scalar loads
    const _Float16* h = (const _Float16*)blk;
    float v[QK];
    for (int j = 0; j < QK; j++) v[j] = (float)h[j];
    for (int j = 0; j < NV; j++) w[j] = VLOAD(v + j * VL);
#endif
}

// y[r0 .. r0 + NR, o .. o + NF] for NF adjacent output features; NR and NF are constants at each
// call site so the accumulators stay in registers. Several features give a one-row step independent
// FMA chains (one feature's chains wait on FMA latency). Each (row, feature) sums its products in an
// order fixed by the vector width alone, whatever NR and NF are.
#if VL == 16
// AVX-512 (32 registers, 2 lane-vectors a block): NV accumulators per (feature, row), summed at the end.
#define FEATURE_BODY(DEQUANT, BYTES)                                                         \
    int64_t nb = in / QK;                                                                     \
    vf acc[4][ROW_CHUNK][NV];                                                                 \
    for (int f = 0; f < NF; f++)                                                              \
        for (int r = 0; r < NR; r++)                                                          \
            for (int j = 0; j < NV; j++) acc[f][r][j] = VZERO();                              \
    for (int64_t b = 0; b < nb; b++) {                                                        \
        vf w[4][NV];                                                                          \
        for (int f = 0; f < NF; f++) {                                                        \
            const uint8_t* blk = blocks + ((o + f) * nb + b) * BYTES;                         \
            PREFETCH(blk + PREFETCH_BYTES);                                                   \
            DEQUANT(blk, w[f]);                                                               \
        }                                                                                     \
        for (int r = 0; r < NR; r++) {                                                        \
            const float* xr = x + (r0 + r) * in + b * QK;                                     \
            for (int j = 0; j < NV; j++) {                                                    \
                vf xv = VLOAD(xr + j * VL);                                                   \
                for (int f = 0; f < NF; f++) acc[f][r][j] = VFMA(w[f][j], xv, acc[f][r][j]);  \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    for (int f = 0; f < NF; f++)                                                              \
        for (int r = 0; r < NR; r++) {                                                        \
            vf s = acc[f][r][0];                                                              \
            for (int j = 1; j < NV; j++) s = VADD(s, acc[f][r][j]);                           \
            y[(r0 + r) * out + o + f] = vsum(s);                                              \
        }
#else
// AVX2 (16 registers, 4 lane-vectors a block): one accumulator per (feature, row), fed the block's
// lane-vectors in order, and one feature's block dequantised at a time, so accumulators, weights
// and x stay in registers. (The AVX-512 layout spilled here: 1.65-1.9x slower at 2-6 rows.)
#define FEATURE_BODY(DEQUANT, BYTES)                                                         \
    int64_t nb = in / QK;                                                                     \
    vf acc[4][ROW_CHUNK];                                                                     \
    for (int f = 0; f < NF; f++)                                                              \
        for (int r = 0; r < NR; r++) acc[f][r] = VZERO();                                     \
    for (int64_t b = 0; b < nb; b++) {                                                        \
        for (int f = 0; f < NF; f++) {                                                        \
            const uint8_t* blk = blocks + ((o + f) * nb + b) * BYTES;                         \
            PREFETCH(blk + PREFETCH_BYTES);                                                   \
            vf w[NV];                                                                         \
            DEQUANT(blk, w);                                                                  \
            for (int r = 0; r < NR; r++) {                                                    \
                const float* xr = x + (r0 + r) * in + b * QK;                                 \
                vf a = acc[f][r];                                                             \
                for (int j = 0; j < NV; j++) a = VFMA(w[j], VLOAD(xr + j * VL), a);           \
                acc[f][r] = a;                                                                \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    for (int f = 0; f < NF; f++)                                                              \
        for (int r = 0; r < NR; r++) y[(r0 + r) * out + o + f] = vsum(acc[f][r]);
#endif

// KIND_features(x, r0, NR, NF, in, blocks, y, out, o): FEATURE_BODY over one kind's blocks.
#define FEATURES_FN(KIND, DEQUANT, BYTES)                                                                   \
    static inline __attribute__((always_inline)) void KIND##_features(                                     \
        const float* x, int64_t r0, const int NR, const int NF, int64_t in, const uint8_t* blocks, float* y, \
        int64_t out, int64_t o) {                                                                          \
        FEATURE_BODY(DEQUANT, BYTES)                                                                       \
    }
FEATURES_FN(q4_1, dequant_q4_1, Q4_1_BYTES)
FEATURES_FN(q8_0, dequant_q8_0, Q8_0_BYTES)
FEATURES_FN(f32, dequant_f32, F32_BYTES)
FEATURES_FN(bf16, dequant_bf16, B16_BYTES)
FEATURES_FN(f16, dequant_f16, B16_BYTES)

// Features per call for N rows: enough independent accumulators to cover FMA latency, few enough
// to stay in the vector registers (32 on AVX-512, 16 on AVX2; measured on each).
#if VL == 16
#define FEATURES_FOR(N) ((N) <= 2 ? 4 : (N) <= 4 ? 3 : (N) <= 6 ? 2 : 1)
#else
#define FEATURES_FOR(N) ((N) <= 2 ? 4 : (N) <= 4 ? 2 : 1)
#endif

typedef struct {  // one row chunk's projection, as specray_parallel's chunks see it
    const float* x;
    const uint8_t* blocks;
    float* y;
    int64_t r0, in, out, feature_bytes;
    int nr, nf;
} LinearJob;

// NR and NF stay constants at each call (FEATURES_FOR(N), or 1 for the features left over).
#define ROWS_CASE(FEATURES, N)                                                                                  \
    case N:                                                                                                     \
        if (j->nf == FEATURES_FOR(N))                                                                           \
            for (int64_t g = g0; g < g1; g++)                                                                   \
                FEATURES(j->x, j->r0, N, FEATURES_FOR(N), j->in, j->blocks, j->y, j->out, g * FEATURES_FOR(N)); \
        else                                                                                                    \
            for (int64_t g = g0; g < g1; g++) FEATURES(j->x, j->r0, N, 1, j->in, j->blocks, j->y, j->out, g);   \
        break;

// A chunk of groups of nf features for one kind (FEATURES) and the job's row count.
#define CHUNK_FN(FEATURES)                                                                                \
    static void FEATURES##_chunk(void* ctx, int64_t g0, int64_t g1, int thread, int fresh) {             \
        (void)thread;                                                                                     \
        const LinearJob* j = (const LinearJob*)ctx;                                                       \
        const int64_t call_bytes = j->nf * j->feature_bytes;                                              \
        if (fresh) prefetch_head(j->blocks + g0 * call_bytes, (g1 - g0) * call_bytes, PREFETCH_BYTES);    \
        switch (j->nr) {                                                                                  \
            ROWS_CASE(FEATURES, 1) ROWS_CASE(FEATURES, 2) ROWS_CASE(FEATURES, 3) ROWS_CASE(FEATURES, 4)   \
            ROWS_CASE(FEATURES, 5) ROWS_CASE(FEATURES, 6) ROWS_CASE(FEATURES, 7) ROWS_CASE(FEATURES, 8)   \
        }                                                                                                 \
    }
CHUNK_FN(q4_1_features)
CHUNK_FN(q8_0_features)
CHUNK_FN(f32_features)
CHUNK_FN(bf16_features)
CHUNK_FN(f16_features)

// Rows a chunk of a many-row step (a prefill) takes: few enough that the chunk's x stays in L1 as
// every feature re-reads it (32 KB on Zen 4: a 1536-wide down_proj's prefill ran 1.4x faster at 4
// rows a chunk than at 8). Which chunk a row falls in never changes its arithmetic.
#define X_CHUNK_BYTES 24576
static inline int64_t rows_per_chunk(int64_t rows, int64_t in) {
    if (rows <= ROW_CHUNK) return ROW_CHUNK;
    int64_t fit = X_CHUNK_BYTES / (in * (int64_t)sizeof(float));
    return fit < 1 ? 1 : fit > ROW_CHUNK ? ROW_CHUNK : fit;
}

#define LINEAR(FEATURES, BYTES)                                                                        \
    const int64_t feature_bytes = in / QK * (BYTES);                                                   \
    const int64_t step_rows = rows_per_chunk(rows, in);                                                \
    for (int64_t r0 = 0; r0 < rows; r0 += step_rows) {                                                 \
        int nr = rows - r0 < step_rows ? (int)(rows - r0) : (int)step_rows, nf = FEATURES_FOR(nr);     \
        LinearJob job = {x, blocks, y, r0, in, out, feature_bytes, nr, nf};                            \
        specray_parallel(out / nf, chunk_for_bytes(nf * feature_bytes), threads, FEATURES##_chunk, &job); \
        job.nf = 1; /* the features left over, one at a time */                                       \
        FEATURES##_chunk(&job, out / nf * nf, out, 0, 1);                                              \
    }

enum { KIND_Q4_1, KIND_Q8_0, KIND_F32, KIND_BF16, KIND_F16 };  // quant_linear.KINDS

// x [rows, in] fp32, blocks [out, in / 32, BYTES of `kind`], y [rows, out].
void specray_exact_linear(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, int kind,
                          int64_t out, float* y, int threads) {
    switch (kind) {
        case KIND_Q4_1: { LINEAR(q4_1_features, Q4_1_BYTES) } break;
        case KIND_Q8_0: { LINEAR(q8_0_features, Q8_0_BYTES) } break;
        case KIND_F32: { LINEAR(f32_features, F32_BYTES) } break;
        case KIND_BF16: { LINEAR(bf16_features, B16_BYTES) } break;
        case KIND_F16: { LINEAR(f16_features, B16_BYTES) } break;
    }
}
