/* Two threads on two CPUs copying through a shared buffer, the way two processes of a
 * node do through the segment: what the cache lines cost, without nemesis around it.
 *
 *   gcc -O2 -pthread -o /tmp/copy_through scripts/experiments/copy_through.c
 *   /tmp/copy_through pingpong BYTES PIECE shared|split   one-way time of a ping-pong
 *   /tmp/copy_through stream RING PIECE                   streaming bandwidth
 *
 * pingpong: each side copies BYTES from its own buffer into a shared one, PIECE bytes at
 * a time with a flag after each, and the other copies them out as they come, then
 * answers the same way; `shared` answers through the same buffer, `split` through a
 * second one. stream: one side copies 4 GB through a ring of RING bytes in pieces of
 * PIECE, the other copies them out. The threads run on the first two CPUs allowed
 * (taskset picks them). BENCHMARKS.md, "A buffer per pair", has figures. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t bytes, piece, ring;
static int split;
static char *area[2];
static _Atomic long flag[2][64 * 16];
static _Atomic long head __attribute__((aligned(128))), tail __attribute__((aligned(128)));
static int cpus[2];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void pin(int i) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpus[i], &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static char *buffer(size_t n, int fill) {
    char *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    memset(p, fill, n);
    return p;
}

/* Direction `dir` (0: ping, 1: pong) has flags of its own; its bytes go through
 * area[dir], which is area[0] for both unless split. */
static void put(int dir, const char *src, long gen) {
    for (size_t k = 0; k * piece < bytes; k++) {
        memcpy(area[dir] + k * piece, src + k * piece, piece);
        atomic_store_explicit(&flag[dir][k * 16], gen, memory_order_release);
    }
}

static void take(int dir, char *dst, long gen) {
    for (size_t k = 0; k * piece < bytes; k++) {
        while (atomic_load_explicit(&flag[dir][k * 16], memory_order_acquire) != gen)
            ;
        memcpy(dst + k * piece, area[dir] + k * piece, piece);
    }
}

static const long ROUNDS = 20000;

static void *pong(void *arg) {
    (void)arg;
    pin(1);
    char *src = buffer(bytes, 1), *dst = buffer(bytes, 0);
    for (long i = 1; i <= ROUNDS; i++) {
        take(0, dst, i);
        put(1, src, i);
    }
    return NULL;
}

static void *drain(void *arg) {
    (void)arg;
    pin(1);
    char *dst = buffer(bytes, 0);
    long n = (long)(ring / piece);
    for (long i = 0; i < (long)(4000000000 / piece); i++) {
        while (atomic_load_explicit(&head, memory_order_acquire) <= i)
            ;
        memcpy(dst + (i * piece) % bytes, area[0] + (i % n) * piece, piece);
        atomic_store_explicit(&tail, i + 1, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv) {
    cpu_set_t s;
    sched_getaffinity(0, sizeof s, &s);
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &s))
            cpus[k++] = c;
    pthread_t t;
    if (argc == 5 && strcmp(argv[1], "pingpong") == 0) {
        bytes = strtoul(argv[2], NULL, 0);
        piece = strtoul(argv[3], NULL, 0);
        split = strcmp(argv[4], "split") == 0;
        if (piece == 0 || bytes % piece || bytes / piece > 64) {
            fprintf(stderr, "BYTES must be 1 to 64 pieces\n");
            return 2;
        }
        area[0] = buffer(bytes, 0);
        area[1] = split ? buffer(bytes, 0) : area[0];
        pthread_create(&t, NULL, pong, NULL);
        pin(0);
        char *src = buffer(bytes, 2), *dst = buffer(bytes, 0);
        double t0 = 0;
        for (long i = 1; i <= ROUNDS; i++) {
            if (i == ROUNDS / 4)
                t0 = now();
            put(0, src, i);
            take(1, dst, i);
        }
        double t1 = now();
        pthread_join(t, NULL);
        printf("pingpong %zu B in pieces of %zu, %s: %.0f ns one way\n", bytes, piece,
               split ? "a buffer per direction" : "one buffer both ways",
               (t1 - t0) / (ROUNDS - ROUNDS / 4 + 1) / 2);
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "stream") == 0) {
        ring = strtoul(argv[2], NULL, 0);
        piece = strtoul(argv[3], NULL, 0);
        bytes = 65536;
        if (piece == 0 || ring % piece || bytes % piece) {
            fprintf(stderr, "RING and 64 KiB must be whole pieces\n");
            return 2;
        }
        area[0] = buffer(ring, 0);
        char *src = buffer(bytes, 3);
        long n = (long)(ring / piece), total = (long)(4000000000 / piece);
        pthread_create(&t, NULL, drain, NULL);
        pin(0);
        double t0 = now();
        for (long i = 0; i < total; i++) {
            while (i - atomic_load_explicit(&tail, memory_order_acquire) >= n)
                ;
            memcpy(area[0] + (i % n) * piece, src + (i * piece) % bytes, piece);
            atomic_store_explicit(&head, i + 1, memory_order_release);
        }
        pthread_join(t, NULL);
        printf("stream through a ring of %zu KiB in pieces of %zu: %.2f GB/s\n", ring >> 10, piece,
               (double)total * piece / (now() - t0));
        return 0;
    }
    fprintf(stderr, "usage: copy_through pingpong BYTES PIECE shared|split | stream RING PIECE\n");
    return 2;
}
