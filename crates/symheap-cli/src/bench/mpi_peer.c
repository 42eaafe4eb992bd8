/* The peer measured against symheap's host backend: MPI_Barrier, MPI_Allreduce (float sum),
 * MPI_Bcast (bytes from rank 0; the slowest rank's time), and
 * one-sided MPI_Put / MPI_Get from rank 0 into rank 1's part of a shared-memory window
 * (MPI_Win_allocate_shared, passive target, each followed by MPI_Win_flush: what symheap's put
 * followed by quiet promises), with the same method as `symheap bench` (median over trials of K
 * back-to-back operations, divided by K). Arguments: `ar:BYTES` (an all_reduce size),
 * `bc:BYTES` (a broadcast size) and `rma:BYTES` (a put/get size). Compiled by `symheap bench` with mpicc when Open MPI is
 * installed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now(void) { return MPI_Wtime(); }

/* Operations per trial by message size: the same as symheap's side (`bench::iters`), so the
 * barrier that starts each trial weighs the same on both sides. */
static int iters(long bytes) {
    return bytes <= (1 << 16) ? 200 : bytes <= (1 << 20) ? 40 : bytes <= (1 << 24) ? 8 : 3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof(double), cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int trials = 15;
    double t[64];
    /* Barrier: K back-to-back barriers. */
    {
        int k = 200;
        for (int w = 0; w < 50; w++) MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < trials; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            for (int j = 0; j < k; j++) MPI_Barrier(MPI_COMM_WORLD);
            t[i] = (now() - t0) / k;
        }
        if (rank == 0) printf("barrier %.9f\n", median(t, trials));
    }
    /* One-sided put and get at the `rma:` sizes (rank 0 times, the others wait at barriers). */
    long rma_max = 0;
    for (int a = 1; a < argc; a++)
        if (strncmp(argv[a], "rma:", 4) == 0 && atol(argv[a] + 4) > rma_max) rma_max = atol(argv[a] + 4);
    if (rma_max > 0 && size > 1) {
        char *base;
        MPI_Win win;
        MPI_Win_allocate_shared(rma_max, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
        char *src = malloc(rma_max), *dst = malloc(rma_max);
        for (long i = 0; i < rma_max; i++) src[i] = (char)(i * 31 % 251);
        MPI_Win_lock_all(0, win);
        for (int a = 1; a < argc; a++) {
            if (strncmp(argv[a], "rma:", 4) != 0) continue;
            long bytes = atol(argv[a] + 4);
            int k = iters(bytes);
            double tp[64], tg[64];
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank == 0) {
                for (int i = 0; i < trials; i++) {
                    double t0 = now();
                    for (int j = 0; j < k; j++) {
                        MPI_Put(src, bytes, MPI_BYTE, 1, 0, bytes, MPI_BYTE, win);
                        MPI_Win_flush(1, win);
                    }
                    tp[i] = (now() - t0) / k;
                }
                for (int i = 0; i < trials; i++) {
                    double t0 = now();
                    for (int j = 0; j < k; j++) {
                        MPI_Get(dst, bytes, MPI_BYTE, 1, 0, bytes, MPI_BYTE, win);
                        MPI_Win_flush(1, win);
                    }
                    tg[i] = (now() - t0) / k;
                }
                printf("put %ld %.9f\n", bytes, median(tp, trials));
                printf("get %ld %.9f\n", bytes, median(tg, trials));
            }
            MPI_Barrier(MPI_COMM_WORLD);
        }
        MPI_Win_unlock_all(win);
        MPI_Win_free(&win);
        free(src);
        free(dst);
    }
    /* Allreduce sizes in bytes from the command line. */
    for (int a = 1; a < argc; a++) {
        if (strncmp(argv[a], "ar:", 3) != 0) continue;
        long bytes = atol(argv[a] + 3);
        long n = bytes / 4;
        float *src = malloc(bytes), *dst = malloc(bytes);
        for (long i = 0; i < n; i++) src[i] = (float)((i * 7 + rank) % 13) * 0.25f;
        int k = iters(bytes);
        for (int w = 0; w < 3; w++) MPI_Allreduce(src, dst, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < trials; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            for (int j = 0; j < k; j++) MPI_Allreduce(src, dst, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t[i] = (now() - t0) / k;
        }
        if (rank == 0) printf("allreduce %ld %.9f\n", bytes, median(t, trials));
        free(src);
        free(dst);
    }
    /* Broadcast sizes in bytes from the command line (root 0, like symheap's rows). */
    for (int a = 1; a < argc; a++) {
        if (strncmp(argv[a], "bc:", 3) != 0) continue;
        long bytes = atol(argv[a] + 3);
        char *buf = malloc(bytes > 0 ? bytes : 1);
        for (long i = 0; i < bytes; i++) buf[i] = (char)((i * 7 + rank) % 13);
        int k = iters(bytes);
        for (int w = 0; w < 3; w++) MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
        for (int i = 0; i < trials; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            for (int j = 0; j < k; j++) MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
            /* The slowest rank's loop: a broadcast is done when every rank has the data, not
             * when the root may return (which only says how far it may run ahead). */
            double mine = (now() - t0) / k;
            MPI_Allreduce(&mine, &t[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        }
        if (rank == 0) printf("bcast %ld %.9f\n", bytes, median(t, trials));
        free(buf);
    }
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
