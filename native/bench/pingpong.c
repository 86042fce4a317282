/* MPI ping-pong between ranks 0 and 1: latency (small messages) and
 * bandwidth (large messages), printed as one JSON object per message size.
 *
 *   mpirun -n 2 ./pingpong [max_bytes] [iterations]
 *
 * Each size runs a warm-up, then `iterations` round trips; latency is half the
 * mean round-trip time, bandwidth is bytes / one-way time. Written for hpvc's
 * locality benchmark (native vs co-resident containers vs isolated ones).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int iterations_for(long bytes, int base) {
    if (bytes >= (1L << 20)) return base / 10 > 10 ? base / 10 : 10;
    return base;
}

int main(int argc, char **argv) {
    int rank = 0, size = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        if (rank == 0) fprintf(stderr, "pingpong: needs 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    long max_bytes = argc > 1 ? atol(argv[1]) : (4L << 20);
    int base = argc > 2 ? atoi(argv[2]) : 2000;
    if (max_bytes < 1 || base < 1) {
        if (rank == 0) fprintf(stderr, "pingpong: bad arguments\n");
        MPI_Finalize();
        return 2;
    }
    char *buf = malloc((size_t)max_bytes);
    if (buf == NULL) MPI_Abort(MPI_COMM_WORLD, 3);
    memset(buf, 1, (size_t)max_bytes);
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(name, &len);
    for (long bytes = 1; bytes <= max_bytes; bytes *= 4) {
        int iters = iterations_for(bytes, base);
        for (int phase = 0; phase < 2; phase++) {
            int n = phase == 0 ? iters / 10 + 1 : iters;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < n && rank < 2; i++) {
                if (rank == 0) {
                    MPI_Send(buf, (int)bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
                    MPI_Recv(buf, (int)bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(buf, (int)bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, (int)bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
                }
            }
            double dt = MPI_Wtime() - t0;
            if (phase == 1 && rank == 0) {
                double one_way = dt / (2.0 * n);
                printf("{\"bytes\": %ld, \"iterations\": %d, \"latency_us\": %.3f,"
                       " \"bandwidth_MBps\": %.1f, \"rank0\": \"%s\"}\n",
                       bytes, n, one_way * 1e6, (double)bytes / one_way / 1e6, name);
                fflush(stdout);
            }
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
