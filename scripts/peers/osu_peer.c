/*
 * The MPI side of `nemesis-bench peers`: the same three measurements nemesis-bench
 * makes of two-sided nemesis, made with whatever MPI this is built with, printing one
 * JSON line per size in the same units.
 *
 *   osu_peer lat  SIZES ITERS WARMUP      ping-pong; p50 of the one-way time (half a
 *                                         round trip), each round trip timed alone
 *   osu_peer bw   SIZES WINDOW ITERS      osu_bw: WINDOW MPI_Isend of SIZE, the receiver's
 *                                         WINDOW MPI_Irecv into one buffer, a 4-byte ack
 *                                         per window; MB/s (10^6 bytes a second)
 *   osu_peer rate SIZES WINDOW ITERS      the same, counted in messages a second
 *   osu_peer coll 0 ITERS WARMUP          MPI_Barrier, and MPI_Allreduce of one double
 *                                         summed: ns per call on rank 0, any number of
 *                                         ranks
 *
 * SIZES is a comma-separated list of byte counts. Run with two ranks, but for coll.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SIZES 64

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_sizes(const char *s, long *out) {
    int n = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && n < MAX_SIZES; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end != '\0' || v < 0) {
            free(copy);
            return -1;
        }
        out[n++] = v;
    }
    free(copy);
    return n;
}

static char *page_buffer(long len) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, len > 0 ? (size_t)len : 1) != 0) {
        fprintf(stderr, "osu_peer: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, 0x5a, len > 0 ? (size_t)len : 1);
    return p;
}

static void latency(int me, long size, long iters, long warmup) {
    char *buf = page_buffer(size);
    double *rtt = malloc(sizeof(double) * (size_t)iters);
    for (long i = 0; i < warmup + iters; i++) {
        if (me == 0) {
            double t0 = now_ns();
            MPI_Send(buf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            double t1 = now_ns();
            if (i >= warmup)
                rtt[i - warmup] = t1 - t0;
        } else {
            MPI_Recv(buf, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
        }
    }
    if (me == 0) {
        qsort(rtt, (size_t)iters, sizeof(double), cmp_double);
        printf("{\"bench\":\"latency\",\"size\":%ld,\"p50_ns\":%.1f,\"samples\":%ld}\n", size,
               rtt[iters / 2] / 2.0, iters);
        fflush(stdout);
    }
    free(rtt);
    free(buf);
}

/* Returns the seconds `iters` windows took, on rank 0. */
static double stream(int me, long size, long window, long iters, long warmup) {
    char *buf = page_buffer(size);
    char ack[4] = {0};
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)window);
    /* A real array, not MPI_STATUSES_IGNORE: gcc takes the null pointer for a buffer. */
    MPI_Status *st = malloc(sizeof(MPI_Status) * (size_t)window);
    double start = 0;
    for (long i = 0; i < warmup + iters; i++) {
        if (i == warmup)
            start = now_ns();
        if (me == 0) {
            for (long k = 0; k < window; k++)
                MPI_Isend(buf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &reqs[k]);
            MPI_Waitall((int)window, reqs, st);
            MPI_Recv(ack, 4, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (long k = 0; k < window; k++)
                MPI_Irecv(buf, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &reqs[k]);
            MPI_Waitall((int)window, reqs, st);
            MPI_Send(ack, 4, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
        }
    }
    double secs = (now_ns() - start) / 1e9;
    free(st);
    free(reqs);
    free(buf);
    return secs;
}

static void usage(void) {
    fprintf(stderr, "usage: osu_peer lat SIZES ITERS WARMUP | bw SIZES WINDOW ITERS | rate SIZES WINDOW ITERS"
                    " | coll 0 ITERS WARMUP\n");
}

static void collectives(int me, int n, long iters, long warmup) {
    double x = 1.0, sum = 0.0;
    for (long i = 0; i < warmup; i++)
        MPI_Barrier(MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_ns();
    for (long i = 0; i < iters; i++)
        MPI_Barrier(MPI_COMM_WORLD);
    double barrier = (now_ns() - t0) / (double)iters;
    for (long i = 0; i < warmup; i++)
        MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_ns();
    for (long i = 0; i < iters; i++)
        MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double allreduce = (now_ns() - t0) / (double)iters;
    if (me == 0) {
        if (sum != (double)n)
            fprintf(stderr, "osu_peer: allreduce gave %f, expected %d\n", sum, n);
        printf("{\"bench\":\"coll\",\"collective\":\"barrier\",\"size\":%d,\"ns\":%.1f}\n", n, barrier);
        printf("{\"bench\":\"coll\",\"collective\":\"allreduce\",\"size\":%d,\"ns\":%.1f}\n", n, allreduce);
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long sizes[MAX_SIZES];
    int count = argc == 5 ? parse_sizes(argv[2], sizes) : -1;
    long a = argc == 5 ? atol(argv[3]) : 0, b = argc == 5 ? atol(argv[4]) : 0;
    if (argc == 5 && strcmp(argv[1], "coll") == 0 && a > 0 && b >= 0) {
        collectives(me, n, a, b);
        MPI_Finalize();
        return 0;
    }
    if (n != 2 || count <= 0 || a <= 0 || b < 0) {
        if (me == 0) {
            if (n != 2)
                fprintf(stderr, "osu_peer: run with 2 ranks, not %d\n", n);
            usage();
        }
        MPI_Finalize();
        return 2;
    }
    for (int s = 0; s < count; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (strcmp(argv[1], "lat") == 0) {
            latency(me, sizes[s], a, b);
        } else if (strcmp(argv[1], "bw") == 0 || strcmp(argv[1], "rate") == 0) {
            long window = a, iters = b > 0 ? b : 1;
            /* As nemesis-bench's: at least 4 windows (see peers.rs, stream_warmup). */
            long warmup = iters / 10 > 4 ? iters / 10 : 4;
            double secs = stream(me, sizes[s], window, iters, warmup);
            double msgs = (double)window * (double)iters;
            if (me == 0 && argv[1][0] == 'b')
                printf("{\"bench\":\"bw\",\"size\":%ld,\"mb_s\":%.3f,\"window\":%ld}\n", sizes[s],
                       msgs * (double)sizes[s] / secs / 1e6, window);
            else if (me == 0)
                printf("{\"bench\":\"msgrate\",\"size\":%ld,\"msgs_per_s\":%.1f,\"window\":%ld}\n", sizes[s],
                       msgs / secs, window);
            fflush(stdout);
        } else {
            if (me == 0)
                usage();
            MPI_Finalize();
            return 2;
        }
    }
    MPI_Finalize();
    return 0;
}
