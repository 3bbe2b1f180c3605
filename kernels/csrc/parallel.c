// specray_parallel: see parallel.h.
#include "parallel.h"

#include <omp.h>

typedef struct {
    _Alignas(64) uint64_t range;  // next chunk (low 32 bits) | end (high 32 bits)
} Share;

// Chunk `front ? next : end - 1` of `share`; 0 once it is empty.
static int claim(Share* share, int front, int64_t* chunk) {
    uint64_t r = __atomic_load_n(&share->range, __ATOMIC_ACQUIRE);
    for (;;) {
        uint64_t next = r & 0xffffffffu, end = r >> 32;
        if (next >= end) return 0;
        uint64_t want = front ? r + 1 : r - (1ULL << 32);
        if (__atomic_compare_exchange_n(&share->range, &r, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *chunk = (int64_t)(front ? next : end - 1);
            return 1;
        }
    }
}

void specray_parallel(int64_t n, int64_t chunk, int threads, specray_chunk_fn fn, void* ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if ((n + chunk - 1) / chunk > 0xffffffffLL) chunk = (n + 0xfffffffeLL) / 0xffffffffLL;
    int64_t chunks = (n + chunk - 1) / chunk;
    if (threads > chunks) threads = (int)chunks;
    if (threads <= 1) {
        fn(ctx, 0, n, 0, 1);
        return;
    }
    Share shares[threads];
    for (int t = 0; t < threads; t++)
        shares[t].range = (uint64_t)(chunks * t / threads) | (uint64_t)(chunks * (t + 1) / threads) << 32;
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num();  // a share whose thread the team lacks is taken by the others
        int64_t k, last = -1;
        for (;;) {
            int found = claim(&shares[t], 1, &k);
            for (int i = 1; !found && i < threads; i++) found = claim(&shares[(t + i) % threads], 0, &k);
            if (!found) break;
            int64_t c0 = k * chunk, c1 = c0 + chunk < n ? c0 + chunk : n;
            fn(ctx, c0, c1, t, k != last);
            last = k + 1;
        }
    }
}

// Tests: each of [0, n) marked by the chunk that ran it, so a test sees every iteration run once.
static void mark(void* ctx, int64_t c0, int64_t c1, int thread, int fresh) {
    (void)fresh;
    int32_t* seen = (int32_t*)ctx;
    for (int64_t i = c0; i < c1; i++) __atomic_fetch_add(&seen[i], 1 + 256 * thread, __ATOMIC_RELAXED);
}

void specray_parallel_check(int64_t n, int64_t chunk, int threads, int32_t* seen) {
    specray_parallel(n, chunk, threads, mark, seen);
}
