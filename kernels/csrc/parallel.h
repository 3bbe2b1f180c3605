// The C kernels' parallel loops: OpenMP threads that share a loop's chunks by stealing.
//
// Each thread owns an equal run of chunks and walks it front to back (a contiguous weight stream for
// its prefetches); a thread done with its own run takes chunks from the back of the others'. On a
// node whose other processes wake up now and then (a server's threads, a draft worker, the load
// generator), a preempted thread's remaining chunks are taken over instead of being waited for at
// the loop's closing barrier (a static split waits for all of them; a guided one hands out half of
// the work first). Claims are compare-and-swaps on the owner's own cache line (OpenMP's dynamic
// schedule, one shared counter, was slower on an idle node). Which thread runs a chunk never
// changes what it computes.
#ifndef SPECRAY_PARALLEL_H
#define SPECRAY_PARALLEL_H
#include <stdint.h>

#ifndef CHUNK_BYTES
#define CHUNK_BYTES 16384  // weight bytes a chunk of a projection reads
#endif

// Runs chunk [c0, c1) of a loop; `thread` < the loop's thread count (per-thread scratch), `fresh`
// when the chunk does not continue the one this thread ran just before (its data is not prefetched).
typedef void (*specray_chunk_fn)(void* ctx, int64_t c0, int64_t c1, int thread, int fresh);

// fn over [0, n) in chunks of `chunk` iterations on up to `threads` OpenMP threads; returns once all
// of it ran.
void specray_parallel(int64_t n, int64_t chunk, int threads, specray_chunk_fn fn, void* ctx);

// Iterations a chunk holds when each reads `bytes` of weights.
static inline int64_t chunk_for_bytes(int64_t bytes) { return bytes >= CHUNK_BYTES ? 1 : CHUNK_BYTES / bytes; }

// The first `ahead` bytes of a chunk about to start: the kernels prefetch `ahead` bytes past what
// they read, so a fresh chunk would otherwise begin on demand misses.
static inline void prefetch_head(const uint8_t* p, int64_t bytes, int64_t ahead) {
    for (int64_t line = 0; line < bytes && line < ahead; line += 64) __builtin_prefetch(p + line, 0, 2);
}
#endif
