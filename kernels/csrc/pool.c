// The kernels' thread pool: see pool.h for why. One loop runs at a time; its chunks are handed out
// through one 64-bit word a thread, tagged with the loop's number, so a worker that wakes up late
// can never claim a chunk of a later loop.
#define _GNU_SOURCE
#include "pool.h"

#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#define MAX_THREADS 256
#define MAX_CHUNKS 0xffff     // a share's bounds are 16 bits each
#define SPIN_NS 200000        // an idle worker spins this long for the next loop, then sleeps
#define MASTER_SPINS 1000     // the caller's spins on a claimed chunk before it yields its core

typedef struct {
    _Alignas(64) uint64_t range;  // loop tag (32 bits) | next chunk (16) | end (16)
} Share;

static struct {
    int enabled;           // 0: loops run on the OpenMP team instead (see specray_use_pool)
    pthread_mutex_t lock;  // held by the caller of the running loop
    uint32_t tag;  // the last loop's: tags make a late claim on an earlier loop's shares fail
    _Alignas(64) uint32_t gen;  // the tag of the pool's last loop; its workers wait on it
    uint32_t sleepers;
    int started;  // workers 1..started exist in this process
    specray_chunk_fn fn;
    void* ctx;
    int64_t n, chunk, chunks;
    int owners;
    _Alignas(64) int64_t done;  // chunks of the running loop that have run
    Share share[MAX_THREADS];
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_while_gen_is(uint32_t seen) {
#if defined(__linux__)
    syscall(SYS_futex, &P.gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)seen;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
#endif
}

static void wake_sleepers(void) {
#if defined(__linux__)
    syscall(SYS_futex, &P.gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
}

static inline uint64_t pack_share(uint32_t tag, int64_t next, int64_t end) {
    return (uint64_t)tag << 32 | (uint64_t)next << 16 | (uint64_t)end;
}

// Chunk `front ? next : end - 1` of thread t's share in loop `tag`; 0 once empty or a later loop.
static int claim(int t, uint32_t tag, int front, int64_t* chunk) {
    uint64_t r = __atomic_load_n(&P.share[t].range, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t next = (int64_t)(r >> 16 & 0xffff), end = (int64_t)(r & 0xffff);
        if ((uint32_t)(r >> 32) != tag || next >= end) return 0;
        uint64_t want = front ? r + (1ULL << 16) : r - 1;
        if (__atomic_compare_exchange_n(&P.share[t].range, &r, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *chunk = front ? next : end - 1;
            return 1;
        }
    }
}

// Thread t's part of loop `tag`: its own share front to back, then the others' from their backs.
static void run(int t, uint32_t tag, int owners) {
    int64_t k, last = -1;
    for (;;) {
        int found = claim(t, tag, 1, &k);
        for (int i = 1; !found && i < owners; i++) found = claim((t + i) % owners, tag, 0, &k);
        if (!found) return;
        // A claimed chunk keeps its loop open (the caller waits for it), so these are its loop's.
        int64_t c0 = k * P.chunk, c1 = c0 + P.chunk < P.n ? c0 + P.chunk : P.n;
        P.fn(P.ctx, c0, c1, t, k != last);
        last = k + 1;
        __atomic_fetch_add(&P.done, 1, __ATOMIC_RELEASE);
    }
}

static uint32_t wait_for_loop(uint32_t seen) {
    int64_t until = now_ns() + SPIN_NS;
    for (int spins = 0;; spins++) {
        uint32_t gen = __atomic_load_n(&P.gen, __ATOMIC_SEQ_CST);
        if (gen != seen) return gen;
        if ((spins & 63) == 0 && now_ns() > until) {
            __atomic_fetch_add(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&P.gen, __ATOMIC_SEQ_CST) == seen) sleep_while_gen_is(seen);
            __atomic_fetch_sub(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            until = now_ns() + SPIN_NS;
        }
        cpu_relax();
    }
}

static void* worker(void* arg) {
    int t = (int)(intptr_t)arg;
    uint32_t seen = __atomic_load_n(&P.gen, __ATOMIC_SEQ_CST);
    for (;;) {
        seen = wait_for_loop(seen);
        int owners = __atomic_load_n(&P.owners, __ATOMIC_ACQUIRE);
        if (t < owners) run(t, seen, owners);
    }
    return NULL;
}

static void forget_workers(void) {  // a forked child has none of its parent's threads
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    P.lock = fresh;
    P.started = 0;
}

static void start_workers(int want) {
    static int registered;
    if (!registered) {
        pthread_atfork(NULL, NULL, forget_workers);
        registered = 1;
    }
    while (P.started < want && P.started < MAX_THREADS - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, worker, (void*)(intptr_t)(P.started + 1));
        pthread_attr_destroy(&attr);
        if (failed) return;
        P.started++;
    }
}

// Where torch's OpenMP threads spin after each of torch's own parallel ops (its default wait policy),
// this pool's workers would fight them for the cores and a claimed chunk could wait a time slice;
// there the loops run on that OpenMP team (the library links torch's libgomp), with the same shares
// and claims but the team's closing barrier. kernels/cpu_kernels.py decides.
void specray_use_pool(int enabled) { P.enabled = enabled; }

static void share_out(uint32_t tag, int64_t chunks, int owners) {
    for (int t = 0; t < owners; t++)
        __atomic_store_n(&P.share[t].range, pack_share(tag, chunks * t / owners, chunks * (t + 1) / owners),
                         __ATOMIC_RELEASE);
    __atomic_store_n(&P.owners, owners, __ATOMIC_RELEASE);
}

static void run_on_openmp(uint32_t tag, int64_t chunks, int threads) {
    share_out(tag, chunks, threads);
#pragma omp parallel num_threads(threads)
    run(omp_get_thread_num(), tag, threads);  // a share whose thread the team lacks is taken by the others
}

void specray_parallel(int64_t n, int64_t chunk, int threads, specray_chunk_fn fn, void* ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if ((n + chunk - 1) / chunk > MAX_CHUNKS) chunk = (n + MAX_CHUNKS - 1) / MAX_CHUNKS;
    int64_t chunks = (n + chunk - 1) / chunk;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1 || chunks <= 1 || pthread_mutex_trylock(&P.lock) != 0) {
        fn(ctx, 0, n, 0, 1);
        return;
    }
    uint32_t tag = ++P.tag;
    P.fn = fn, P.ctx = ctx, P.n = n, P.chunk = chunk, P.chunks = chunks;
    __atomic_store_n(&P.done, 0, __ATOMIC_RELAXED);
    if (!P.enabled) {
        run_on_openmp(tag, chunks, threads);
        pthread_mutex_unlock(&P.lock);
        return;
    }
    start_workers(threads - 1);
    int owners = threads < P.started + 1 ? threads : P.started + 1;
    share_out(tag, chunks, owners);
    __atomic_store_n(&P.gen, tag, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&P.sleepers, __ATOMIC_SEQ_CST)) wake_sleepers();
    run(0, tag, owners);
    for (int spins = 0; __atomic_load_n(&P.done, __ATOMIC_ACQUIRE) < chunks; spins++) {
        if (spins < MASTER_SPINS)
            cpu_relax();
        else
            sched_yield();  // the chunk's thread may be waiting for this core
    }
    pthread_mutex_unlock(&P.lock);
}

// Tests: each of [0, n) marked by the chunk that ran it, so a test sees every index run once.
static void mark(void* ctx, int64_t c0, int64_t c1, int thread, int fresh) {
    (void)fresh;
    int32_t* seen = (int32_t*)ctx;
    for (int64_t i = c0; i < c1; i++) __atomic_fetch_add(&seen[i], 1 + 256 * thread, __ATOMIC_RELAXED);
}

void specray_parallel_check(int64_t n, int64_t chunk, int threads, int32_t* seen) {
    specray_parallel(n, chunk, threads, mark, seen);
}
