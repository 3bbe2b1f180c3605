// y = x @ W^T in the "fast" numeric mode: x quantised to 8 bits per 32-block, integer dot products.
//
// Why: the exact kernel (quant_linear.c) widens every weight to fp32 and spends one FMA per weight
// and row, so a decode step is compute-bound before it is memory-bound and each verification row
// costs nearly a step's arithmetic. Here a row's block of 32 activations becomes 32 int8 and a scale
// (llama.cpp's Q8 activations) and a block's products are summed in int32 (VNNI: 64 multiply-adds an
// instruction), which changes the numbers (the mode's own model) but not the rules: each row is
// quantised and summed alone, so a row's output never depends on the other rows of the step.
//
// Lanes. Sixteen blocks make a group, one int32 lane each: lane b is block b's exact dot product
// of its 32 integer weights and 32 integer activations. Every path (AVX-512, AVX2, scalar) forms
// those integers and then runs the same float operations lane by lane, group after group:
//   acc[b] = fma(float(dot[b]), dw[b] * dx[b], acc[b]);  acc[b] = fma(m[b], s[b], acc[b])  (Q4_1)
// and one pairwise sum of the 16 lanes, so all paths give bit-identical outputs.
//
// Weight layout (`fast_linear.pack_fast`), per output feature, group after group (t <= 16 blocks
// in the last). Part v of a group holds, for each block b, 4 bytes at 4b: elements 4v..4v+3.
//   Q4_1: parts 0-3, each byte element (4v + i) low, (16 + 4v + i) high; t fp16 d; t fp16 m (20 B a block)
//   Q8_0: parts 0-7 of w + 128 (unsigned); t fp16 d (34 B a block)
// Activation layout (`specray_fast_quantize`), per row, group after group, GROUP_BYTES each:
//   int8 parts 0-7 (64 bytes each, as above), float dx[16], float s[16] (= dx * sum(q)),
//   int32 corr[16] (= -128 * sum(q): what w + 128 adds); absent blocks are zeros.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "parallel.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32
#define GB 16             // blocks in a group: one lane each
#define PARTS 8           // 4-element slices of a block
#define GROUP_BYTES 704   // one row's group of activations: 8 x 64 int8, then dx, s, corr
#define DX_AT 512
#define S_AT 576
#define CORR_AT 640
#define KIND_Q4_1 0
#define KIND_Q8_0 1
#ifndef FAST_PREFETCH_BYTES
#define FAST_PREFETCH_BYTES 4096  // how far ahead of the weight stream
#endif
#define PREFETCH_BYTES FAST_PREFETCH_BYTES
#define PREFETCH(p) __builtin_prefetch((p), 0, 2)

static int block_bytes(int kind) { return kind == KIND_Q4_1 ? 20 : 34; }

static inline int64_t num_groups(int64_t nb) { return (nb + GB - 1) / GB; }

// -- activations ---------------------------------------------------------------------------------
// Blocks whose largest magnitude is below this quantise to zero (127 / amax would overflow).
#define MIN_AMAX 1e-30f

int64_t specray_fast_scratch_bytes(int64_t rows, int64_t in) { return rows * num_groups(in / QK) * GROUP_BYTES; }

// One block: q = round-half-even(x * 127 / amax) clamped to +-127, d = amax / 127 (the torch
// reference is `fast_linear.quantize_activations`). Non-finite: q = 0, d = s = NaN. The vector
// versions compute the same bits (the conversion rounds half to even, as rintf does).
static void store_block(uint8_t* g, int b, float d, int sum) {
    ((float*)(g + DX_AT))[b] = d;
    ((float*)(g + S_AT))[b] = d * (float)sum;
    ((int32_t*)(g + CORR_AT))[b] = -128 * sum;
}

static void quantize_block(const float* xb, uint8_t* g, int b) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
    if ((__mmask16)(_mm512_cmp_ps_mask(a0, big, _CMP_LE_OQ) & _mm512_cmp_ps_mask(a1, big, _CMP_LE_OQ)) != 0xffff) {
        ((float*)(g + DX_AT))[b] = ((float*)(g + S_AT))[b] = NAN;
        return;
    }
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    if (!(amax >= MIN_AMAX)) return;
    __m512 id = _mm512_set1_ps(127.f / amax);
    __m512i lim = _mm512_set1_epi32(127), q0, q1;
    q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), _mm512_sub_epi32(_mm512_setzero_si512(), lim)), lim);
    q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, id)), _mm512_sub_epi32(_mm512_setzero_si512(), lim)), lim);
    int32_t words[8];  // four int8 each: elements 4k..4k+3
    _mm_storeu_si128((__m128i*)words, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(words + 4), _mm512_cvtepi32_epi8(q1));
    for (int k = 0; k < 8; k++) memcpy(g + 64 * k + 4 * b, &words[k], 4);
    store_block(g, b, amax / 127.f, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
#else
    float amax = 0.f;
    int finite = 1;
    for (int j = 0; j < QK; j++) {
        float a = fabsf(xb[j]);
        finite &= a <= FLT_MAX;  // false for inf and NaN
        amax = a > amax ? a : amax;
    }
    if (!finite) {
        ((float*)(g + DX_AT))[b] = ((float*)(g + S_AT))[b] = NAN;
        return;
    }
    if (!(amax >= MIN_AMAX)) return;  // zeros already
    float id = 127.f / amax;
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        float q = rintf(xb[j] * id);
        q = q > 127.f ? 127.f : q < -127.f ? -127.f : q;
        sum += (int)q;
        g[64 * (j / 4) + 4 * b + j % 4] = (uint8_t)(int8_t)q;
    }
    store_block(g, b, amax / 127.f, sum);
#endif
}

// x [rows, in] fp32 -> act [rows, groups, GROUP_BYTES].
void specray_fast_quantize(const float* x, int64_t rows, int64_t in, uint8_t* act) {
    int64_t nb = in / QK, ng = num_groups(nb);
    memset(act, 0, rows * ng * GROUP_BYTES);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++)
            quantize_block(x + r * in + b * QK, act + (r * ng + b / GB) * GROUP_BYTES, (int)(b % GB));
}

// The pairwise sum every path uses: halves, quarters, then (0 + 2) + (1 + 3).
static inline float lane_sum(const float v[16]) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// -- the portable path -------------------------------------------------------------------------------
static inline float half_to_float(uint16_t h) {  // exact
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f)
        bits = sign | 0x7f800000u | (man << 13);
    else if (exp)
        bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man)
        bits = sign;
    else {  // subnormal: normalise
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float load_half(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_to_float(h);
}

// Element j of block b of a group of t blocks, as a signed integer.
static inline int weight_at(const uint8_t* g, int t, int kind, int b, int j) {
    if (kind == KIND_Q8_0) return (int)g[4 * t * (j / 4) + 4 * b + j % 4] - 128;
    int v = (j % 16) / 4;
    uint8_t byte = g[4 * t * v + 4 * b + j % 4];
    return j < 16 ? byte & 0x0f : byte >> 4;
}

static void scalar_group(const uint8_t* g, int t, int kind, const uint8_t* act, float acc[16]) {
    const float *dx = (const float*)(act + DX_AT), *s = (const float*)(act + S_AT);
    const uint8_t* scales = g + (kind == KIND_Q4_1 ? 16 : 32) * t;
    for (int b = 0; b < GB; b++) {
        int32_t dot = 0;
        float dw = 0.f, m = 0.f;
        if (b < t) {
            for (int j = 0; j < QK; j++) dot += weight_at(g, t, kind, b, j) * (int8_t)act[64 * (j / 4) + 4 * b + j % 4];
            dw = load_half(scales + 2 * b);
            if (kind == KIND_Q4_1) m = load_half(scales + 2 * t + 2 * b);
        }
        acc[b] = fmaf((float)dot, dw * dx[b], acc[b]);
        if (kind == KIND_Q4_1) acc[b] = fmaf(m, s[b], acc[b]);
    }
}

// y[r, o] for rows [0, rows) of one feature o.
__attribute__((unused)) static void scalar_feature(const uint8_t* feature, int64_t nb, int kind,
                                                   const uint8_t* act, int64_t rows, float* y, int64_t out,
                                                   int64_t o) {
    int64_t ng = num_groups(nb);
    for (int64_t r = 0; r < rows; r++) {
        float acc[16] = {0};
        for (int64_t g = 0; g < ng; g++) {
            int t = (int)(nb - g * GB < GB ? nb - g * GB : GB);
            scalar_group(feature + g * GB * block_bytes(kind), t, kind, act + (r * ng + g) * GROUP_BYTES, acc);
        }
        y[r * out + o] = lane_sum(acc);
    }
}

// Each path defines FAST_ROW_CHUNK, features_per_call(rows) and fast_features(...): y for `nf`
// adjacent features (from `first`, `stride` bytes apart) and `nr` <= FAST_ROW_CHUNK rows.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "fast_linear_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "fast_linear_avx2.h"
#else
#define FAST_ROW_CHUNK 8
static int features_per_call(int64_t rows) {
    (void)rows;
    return 1;
}
static void fast_features(const uint8_t* first, int64_t stride, int64_t nb, int kind, const uint8_t* act, int nr,
                          float* y, int64_t out, int64_t o, int nf) {
    for (int f = 0; f < nf; f++) scalar_feature(first + f * stride, nb, kind, act, nr, y, out, o + f);
}
#endif

typedef struct {  // one row chunk's projection, as specray_parallel's chunks see it
    const uint8_t *blocks, *act;
    int64_t stride, nb, out;
    int kind, nr, nf;
    float* y;
} FastJob;

static void fast_chunk(void* ctx, int64_t c0, int64_t c1, int thread, int fresh) {
    (void)thread;
    const FastJob* j = (const FastJob*)ctx;
    const int64_t call_bytes = j->nf * j->stride;
    if (fresh) prefetch_head(j->blocks + c0 * call_bytes, (c1 - c0) * call_bytes, PREFETCH_BYTES);
    for (int64_t c = c0; c < c1; c++)
        fast_features(j->blocks + c * call_bytes, j->stride, j->nb, j->kind, j->act, j->nr, j->y, j->out, c * j->nf, j->nf);
}

// act [rows, groups, GROUP_BYTES] from `specray_fast_quantize`, blocks [out, nb * block bytes], y [rows, out].
void specray_fast_linear_q(const uint8_t* act, int64_t rows, int64_t in, const uint8_t* blocks, int kind,
                           int64_t out, float* y, int threads) {
    int64_t nb = in / QK, ng = num_groups(nb), stride = nb * block_bytes(kind);
    for (int64_t r0 = 0; r0 < rows; r0 += FAST_ROW_CHUNK) {
        int nr = (int)(rows - r0 < FAST_ROW_CHUNK ? rows - r0 : FAST_ROW_CHUNK);
        const int nf = features_per_call(nr);
        FastJob job = {blocks, act + r0 * ng * GROUP_BYTES, stride, nb, out, kind, nr, nf, y + r0 * out};
        specray_parallel(out / nf, chunk_for_bytes(nf * stride), threads, fast_chunk, &job);
        for (int64_t o = out / nf * nf; o < out; o++)
            fast_features(blocks + o * stride, stride, nb, kind, job.act, nr, job.y, out, o, 1);
    }
}

// The same on fp32 x [rows, in]; act: specray_fast_scratch_bytes(rows, in) bytes of scratch.
void specray_fast_linear(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, int kind,
                         int64_t out, float* y, uint8_t* act, int threads) {
    specray_fast_quantize(x, rows, in, act);
    specray_fast_linear_q(act, rows, in, blocks, kind, out, y, threads);
}
