// The kernels' own thread pool (pool.c): a parallel loop whose caller never waits for a thread
// that is not running.
//
// Why not OpenMP: a `parallel for` ends in a barrier every thread of the team must reach. On a node
// where other processes wake up now and then (a server's threads, a draft worker, the load
// generator), one of the step's threads is preempted for a while, and the others wait at each of a
// step's 120-odd barriers for it to run again, whatever the schedule. Here each thread owns an equal
// run of chunks and walks it front to back (contiguous weight streams for the prefetches), a thread
// done with its own run takes chunks from the back of the others', and the caller returns once
// every chunk has run: a thread that never got the CPU costs nothing, one preempted inside a chunk
// costs that chunk. Claims are compare-and-swaps on the owner's own cache line (a shared counter,
// OpenMP's dynamic schedule, was slower on an idle node). Which thread runs a chunk never changes
// what it computes.
#ifndef SPECRAY_POOL_H
#define SPECRAY_POOL_H
#include <stdint.h>

#ifndef CHUNK_BYTES
#define CHUNK_BYTES 16384  // weight bytes a chunk of a projection reads
#endif

// Runs chunk [c0, c1) of the loop; `thread` < the loop's thread count (per-thread scratch), `fresh`
// when the chunk does not continue the one this thread ran just before (its data is not prefetched).
typedef void (*specray_chunk_fn)(void* ctx, int64_t c0, int64_t c1, int thread, int fresh);

// fn over [0, n) in chunks of `chunk` on up to `threads` threads (the caller is thread 0); returns
// once all of it ran. Calls from several threads at once are safe (a second caller runs alone).
void specray_parallel(int64_t n, int64_t chunk, int threads, specray_chunk_fn fn, void* ctx);

// Iterations a chunk holds when each reads `bytes` of weights.
static inline int64_t chunk_for_bytes(int64_t bytes) { return bytes >= CHUNK_BYTES ? 1 : CHUNK_BYTES / bytes; }

// The first `ahead` bytes of a chunk about to start: the kernels prefetch `ahead` bytes past what
// they read, so a fresh chunk would otherwise begin on demand misses.
static inline void prefetch_head(const uint8_t* p, int64_t bytes, int64_t ahead) {
    for (int64_t line = 0; line < bytes && line < ahead; line += 64) __builtin_prefetch(p + line, 0, 2);
}
#endif
