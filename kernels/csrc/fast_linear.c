// y = x @ W^T in the "fast" numeric mode: x quantised to 8 bits per 32-block, integer dot products.
//
// Why: the exact kernel (quant_linear.c) widens every weight to fp32 and spends one FMA per weight
// and row, so a decode step is compute-bound before it is memory-bound and each verification row
// costs nearly a step's arithmetic. Here a row's block of 32 activations becomes 32 int8 and a scale
// (llama.cpp's Q8 activations) and a block's products are summed in int32 (VNNI: 64 multiply-adds an
// instruction), which changes the numbers (the mode's own model) but not the rules: each row is
// quantised and summed alone, so a row's output never depends on the other rows of the step.
//
// Lanes. Sixteen output features make a tile, one lane each, and a row's 4 activations at a time
// are broadcast to every lane: no lane ever holds another feature's sums, so nothing is reduced
// across lanes and a verification row costs its integer multiply-adds and four float operations a
// block. Every path (AVX-512, AVX2, scalar) forms each feature's exact int32 dot product with a
// block and then runs, lane by lane, block after block:
//   acc = fma(float(dot), dw * dx, acc);  acc = fma(m, s, acc)  (Q4_1)
// so all paths give bit-identical outputs.
//
// Weight layout (`fast_linear.pack_fast`): tiles of 16 features (the last padded with zero blocks),
// each its blocks in order; a tile's block is its features' block b, interleaved by 4 elements:
//   Q4_1: parts p = 0-3 of 64 bytes, bytes 4f..4f+3 of feature f: elements 4p+i low, 16+4p+i high;
//         16 fp16 d; 16 fp16 m (320 B: 20 a feature)
//   Q8_0: parts v = 0-7 of 64 bytes, bytes 4f..4f+3: elements 4v..4v+3 as w + 128 (unsigned);
//         16 fp16 d (544 B: 34 a feature)
// Activation layout (`specray_fast_quantize`), per row, block after block, ACT_BYTES each:
//   int8 q[32], float dx, float s (= dx * sum(q)), int32 corr (= -128 * sum(q): what w + 128 adds).
// fast16 (`specray_fast16_quantize`): two such rows a row, its quantisation and that of what it
// leaves; the kernel sums each in its lanes as above and stores their sum (`pairs`).
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "parallel.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32
#define TILE 16       // features in a tile: one lane each
#define ACT_BYTES 48  // one row's block of activations: q[32], dx, s, corr, 4 bytes of padding
#define DX_AT 32
#define S_AT 36
#define CORR_AT 40
#define KIND_Q4_1 0
#define KIND_Q8_0 1
#ifndef FAST_PREFETCH_BYTES
#define FAST_PREFETCH_BYTES 4096  // how far ahead of the weight stream
#endif
#define PREFETCH_BYTES FAST_PREFETCH_BYTES
#define PREFETCH(p) __builtin_prefetch((p), 0, 2)

static inline int64_t tile_block_bytes(int kind) { return kind == KIND_Q4_1 ? 320 : 544; }
static inline int64_t scales_at(int kind) { return kind == KIND_Q4_1 ? 256 : 512; }  // fp16 d[16], then m[16]

static inline int32_t act_word(const uint8_t* a, int v) {  // elements 4v..4v+3 of a block, as one int32
    int32_t w;
    memcpy(&w, a + 4 * v, 4);
    return w;
}
static inline float act_float(const uint8_t* a, int at) {
    float f;
    memcpy(&f, a + at, 4);
    return f;
}

// -- activations ---------------------------------------------------------------------------------
// Blocks whose largest magnitude is below this quantise to zero (127 / amax would overflow).
#define MIN_AMAX 1e-30f

int64_t specray_fast_scratch_bytes(int64_t rows, int64_t in) { return rows * (in / QK) * ACT_BYTES; }

// One block: q = round-half-even(x * 127 / amax) clamped to +-127, d = amax / 127 (the torch
// reference is `fast_linear.quantize_activations`). Non-finite: q = 0, d = s = NaN. The vector
// versions compute the same bits (the conversion rounds half to even, as rintf does).
static void store_scales(uint8_t* a, float d, int sum) {
    float s = d * (float)sum;
    int32_t corr = -128 * sum;
    memcpy(a + DX_AT, &d, 4);
    memcpy(a + S_AT, &s, 4);
    memcpy(a + CORR_AT, &corr, 4);
}

static void store_nan(uint8_t* a) {
    float nan = NAN;
    memcpy(a + DX_AT, &nan, 4);
    memcpy(a + S_AT, &nan, 4);
}

static void quantize_block(const float* xb, uint8_t* a) {  // a: zeros on entry
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
    if ((__mmask16)(_mm512_cmp_ps_mask(a0, big, _CMP_LE_OQ) & _mm512_cmp_ps_mask(a1, big, _CMP_LE_OQ)) != 0xffff) {
        store_nan(a);
        return;
    }
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    if (!(amax >= MIN_AMAX)) return;
    __m512 id = _mm512_set1_ps(127.f / amax);
    __m512i lim = _mm512_set1_epi32(127), q0, q1;
    q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), _mm512_sub_epi32(_mm512_setzero_si512(), lim)), lim);
    q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, id)), _mm512_sub_epi32(_mm512_setzero_si512(), lim)), lim);
    _mm_storeu_si128((__m128i*)a, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(a + 16), _mm512_cvtepi32_epi8(q1));
    store_scales(a, amax / 127.f, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
#else
    float amax = 0.f;
    int finite = 1;
    for (int j = 0; j < QK; j++) {
        float v = fabsf(xb[j]);
        finite &= v <= FLT_MAX;  // false for inf and NaN
        amax = v > amax ? v : amax;
    }
    if (!finite) {
        store_nan(a);
        return;
    }
    if (!(amax >= MIN_AMAX)) return;  // zeros already
    float id = 127.f / amax;
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        float q = rintf(xb[j] * id);
        q = q > 127.f ? 127.f : q < -127.f ? -127.f : q;
        sum += (int)q;
        a[j] = (uint8_t)(int8_t)q;
    }
    store_scales(a, amax / 127.f, sum);
#endif
}

// x [rows, in] fp32 -> act [rows, in / 32, ACT_BYTES].
void specray_fast_quantize(const float* x, int64_t rows, int64_t in, uint8_t* act) {
    int64_t nb = in / QK;
    memset(act, 0, rows * nb * ACT_BYTES);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) quantize_block(x + r * in + b * QK, act + (r * nb + b) * ACT_BYTES);
}

// The two-part activations of the fast16 mode: x [rows, in] -> act [2 * rows, in / 32, ACT_BYTES],
// row 2r x's row r quantised, row 2r + 1 what that leaves, fmaf(-dx, q, x) (one rounding), quantised
// the same way (the torch reference is `fast_linear.quantize_two_part`).
void specray_fast16_quantize(const float* x, int64_t rows, int64_t in, uint8_t* act) {
    int64_t nb = in / QK;
    memset(act, 0, 2 * rows * nb * ACT_BYTES);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float* xb = x + r * in + b * QK;
            uint8_t *first = act + (2 * r * nb + b) * ACT_BYTES, *rest = first + nb * ACT_BYTES;
            quantize_block(xb, first);
            float dx = act_float(first, DX_AT), left[QK];
            for (int j = 0; j < QK; j++) left[j] = fmaf(-dx, (float)(int8_t)first[j], xb[j]);
            quantize_block(left, rest);
        }
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

// Element j of feature f in a tile's block w, as a signed integer.
static inline int weight_at(const uint8_t* w, int kind, int f, int j) {
    if (kind == KIND_Q8_0) return (int)w[64 * (j / 4) + 4 * f + j % 4] - 128;
    uint8_t byte = w[64 * ((j % 16) / 4) + 4 * f + j % 4];
    return j < 16 ? byte & 0x0f : byte >> 4;
}

// The lane arithmetic of the header for one tile's block w and one row's block a.
static void scalar_block(const uint8_t* w, int kind, const uint8_t* a, float acc[TILE]) {
    const float dx = act_float(a, DX_AT), s = act_float(a, S_AT);
    for (int f = 0; f < TILE; f++) {
        int32_t dot = 0;
        for (int j = 0; j < QK; j++) dot += weight_at(w, kind, f, j) * (int8_t)a[j];
        acc[f] = fmaf((float)dot, load_half(w + scales_at(kind) + 2 * f) * dx, acc[f]);
        if (kind == KIND_Q4_1) acc[f] = fmaf(load_half(w + scales_at(kind) + 2 * TILE + 2 * f), s, acc[f]);
    }
}

// y[r, o .. o + 16) (those below `out`) for rows [0, rows) of the tile at `tile`; `pairs`: rows / 2
// of them, row r / 2 the sum of activation rows r and r + 1 (the fast16 mode's two parts).
__attribute__((unused)) static void scalar_tile(const uint8_t* tile, int64_t nb, int kind, const uint8_t* act,
                                                int64_t rows, float* y, int64_t out, int64_t o, int pairs) {
    for (int64_t r = 0; r < rows; r += 1 + pairs) {
        float acc[2][TILE] = {{0}};
        for (int part = 0; part <= pairs; part++)
            for (int64_t b = 0; b < nb; b++)
                scalar_block(tile + b * tile_block_bytes(kind), kind, act + ((r + part) * nb + b) * ACT_BYTES, acc[part]);
        float* yr = y + (pairs ? r / 2 : r) * out + o;
        for (int f = 0; f < TILE && o + f < out; f++) yr[f] = pairs ? acc[0][f] + acc[1][f] : acc[0][f];
    }
}

// Each path defines FAST_ROW_CHUNK and fast_tile(...): y for one tile and `nr` <= FAST_ROW_CHUNK rows.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "fast_linear_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "fast_linear_avx2.h"
#else
#define FAST_ROW_CHUNK 8
static void fast_tile(const uint8_t* tile, int64_t nb, int kind, const uint8_t* act, int nr, float* y, int64_t out,
                      int64_t o, int pairs) {
    scalar_tile(tile, nb, kind, act, nr, y, out, o, pairs);
}
#endif

#ifndef FAST_BLOCK_ROWS
#define FAST_BLOCK_ROWS 64  // activation rows a tile is read for once from memory (147 KB of them at in 1536)
#endif
_Static_assert(FAST_BLOCK_ROWS % FAST_ROW_CHUNK == 0, "a block holds whole row chunks (fast16's pairs stay together)");

typedef struct {  // one row block's projection, as specray_parallel's chunks see it
    const uint8_t *blocks, *act;
    int64_t stride, nb, out, rows;
    int kind, pairs;
    float* y;
} FastJob;

// Each tile for every row chunk of the block in turn: the tile's weights come from memory once, the
// later chunks read them from L1 (a step of more rows than a chunk holds: fast16's two parts a row).
static void fast_chunk(void* ctx, int64_t c0, int64_t c1, int thread, int fresh) {
    (void)thread;
    const FastJob* j = (const FastJob*)ctx;
    if (fresh) prefetch_head(j->blocks + c0 * j->stride, (c1 - c0) * j->stride, PREFETCH_BYTES);
    for (int64_t t = c0; t < c1; t++)
        for (int64_t r0 = 0; r0 < j->rows; r0 += FAST_ROW_CHUNK) {
            int nr = (int)(j->rows - r0 < FAST_ROW_CHUNK ? j->rows - r0 : FAST_ROW_CHUNK);
            fast_tile(j->blocks + t * j->stride, j->nb, j->kind, j->act + r0 * j->nb * ACT_BYTES, nr,
                      j->y + (j->pairs ? r0 / 2 : r0) * j->out, j->out, t * TILE, j->pairs);
        }
}

// act [rows, in / 32, ACT_BYTES] activation rows, blocks [tiles, nb * tile block bytes] -> y [rows,
// out], or with `pairs` (rows even) y [rows / 2, out], each the sum of two rows' (a row chunk is even).
// Every row goes through the same chunks of FAST_ROW_CHUNK rows however the loops are ordered.
static void linear_q(const uint8_t* act, int64_t rows, int64_t in, const uint8_t* blocks, int kind, int64_t out,
                     float* y, int threads, int pairs) {
    const int64_t nb = in / QK, stride = nb * tile_block_bytes(kind), tiles = (out + TILE - 1) / TILE;
    for (int64_t r0 = 0; r0 < rows; r0 += FAST_BLOCK_ROWS) {
        int64_t nr = rows - r0 < FAST_BLOCK_ROWS ? rows - r0 : FAST_BLOCK_ROWS;
        FastJob job = {blocks, act + r0 * nb * ACT_BYTES, stride, nb, out, nr, kind, pairs, y + (pairs ? r0 / 2 : r0) * out};
        specray_parallel(tiles, chunk_for_bytes(stride), threads, fast_chunk, &job);
    }
}

// act [rows, in / 32, ACT_BYTES] from `specray_fast_quantize`, blocks [tiles, nb * tile block
// bytes], y [rows, out].
void specray_fast_linear_q(const uint8_t* act, int64_t rows, int64_t in, const uint8_t* blocks, int kind,
                           int64_t out, float* y, int threads) {
    linear_q(act, rows, in, blocks, kind, out, y, threads, 0);
}

// The same on fp32 x [rows, in]; act: specray_fast_scratch_bytes(rows, in) bytes of scratch.
void specray_fast_linear(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, int kind,
                         int64_t out, float* y, uint8_t* act, int threads) {
    specray_fast_quantize(x, rows, in, act);
    linear_q(act, rows, in, blocks, kind, out, y, threads, 0);
}

// The fast16 mode: each row's two parts (`specray_fast16_quantize`) summed by the same lanes, then
// added; act: specray_fast_scratch_bytes(2 * rows, in) bytes of scratch.
void specray_fast16_linear(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, int kind,
                           int64_t out, float* y, uint8_t* act, int threads) {
    specray_fast16_quantize(x, rows, in, act);
    linear_q(act, 2 * rows, in, blocks, kind, out, y, threads, 1);
}
