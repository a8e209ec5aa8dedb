/* One buffer copied by one thread, or by two threads each taking half at once: what a
 * second CPU adds to a large copy, with memcpy or with cross-memory attach.
 *
 *   gcc -O2 -pthread -o /tmp/copy_halves scripts/experiments/copy_halves.c
 *   /tmp/copy_halves BYTES memcpy|cma 1|2 [REPS]
 *
 * With 2, the threads run on the first two CPUs allowed, the first copying the bytes
 * before the page boundary nearest the middle, the second the rest; with 1, the first
 * copies everything. `cma` copies with process_vm_readv on this process's own memory,
 * as a receiver reads its sender's. Prints the average and the best of REPS (default 60)
 * repetitions after three untimed ones. BENCHMARKS.md, "Both processes copying a large
 * message at once", has figures. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static char *src, *dst;
static int use_cma;
static pthread_barrier_t go;
static long reps;

struct part {
    size_t off, len;
    int cpu;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void copy(char *to, const char *from, size_t n) {
    if (!use_cma) {
        memcpy(to, from, n);
        return;
    }
    struct iovec local = {to, n}, remote = {(void *)from, n};
    if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)n) {
        perror("process_vm_readv");
        exit(1);
    }
}

static void *worker(void *arg) {
    struct part *p = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(p->cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    for (long i = 0; i < reps + 3; i++) {
        pthread_barrier_wait(&go);
        if (p->len)
            copy(dst + p->off, src + p->off, p->len);
        pthread_barrier_wait(&go);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s BYTES memcpy|cma 1|2 [REPS]\n", argv[0]);
        return 2;
    }
    size_t n = strtoull(argv[1], NULL, 0);
    use_cma = strcmp(argv[2], "cma") == 0;
    int halves = atoi(argv[3]) == 2;
    reps = argc > 4 ? atol(argv[4]) : 60;
    if (n == 0 || reps < 1 || (!use_cma && strcmp(argv[2], "memcpy") != 0)) {
        fprintf(stderr, "usage: %s BYTES memcpy|cma 1|2 [REPS]\n", argv[0]);
        return 2;
    }
    cpu_set_t allowed;
    sched_getaffinity(0, sizeof allowed, &allowed);
    int cpus[2] = {0, 0}, k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &allowed))
            cpus[k++] = c;
    if (k < 2)
        cpus[1] = cpus[0];
    src = aligned_alloc(4096, (n + 4095) & ~4095UL);
    dst = aligned_alloc(4096, (n + 4095) & ~4095UL);
    memset(src, 1, n);
    memset(dst, 2, n);
    size_t cut = halves ? (n / 2) & ~4095UL : n;
    struct part a = {0, cut, cpus[0]}, b = {cut, n - cut, cpus[1]};
    pthread_barrier_init(&go, NULL, 3);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, worker, &a);
    pthread_create(&tb, NULL, worker, &b);
    double best = 1e30, total = 0;
    for (long i = 0; i < reps + 3; i++) {
        double t0 = now();
        pthread_barrier_wait(&go);
        pthread_barrier_wait(&go);
        double t = now() - t0;
        if (i >= 3) {
            total += t;
            if (t < best)
                best = t;
        }
    }
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    if (memcmp(src, dst, n) != 0) {
        fprintf(stderr, "the copy differs from its source\n");
        return 1;
    }
    printf("%zu bytes, %s, %s: average %.2f GB/s, best %.2f GB/s\n", n, argv[2],
           halves ? "two halves at once" : "one thread", n * (double)reps / total / 1e9, n / best / 1e9);
    return 0;
}
