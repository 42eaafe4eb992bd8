/* The peer measured against symheap's host backend: MPI_Barrier and MPI_Allreduce (float sum)
 * with the same method as `symheap bench` (median over trials of K back-to-back operations,
 * divided by K). Compiled by `symheap bench` with mpicc when Open MPI is installed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now(void) { return MPI_Wtime(); }

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
    /* Allreduce sizes in bytes from the command line. */
    for (int a = 1; a < argc; a++) {
        long bytes = atol(argv[a]);
        long n = bytes / 4;
        float *src = malloc(bytes), *dst = malloc(bytes);
        for (long i = 0; i < n; i++) src[i] = (float)((i * 7 + rank) % 13) * 0.25f;
        int k = bytes <= (1 << 16) ? 100 : bytes <= (1 << 20) ? 20 : 4;
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
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
