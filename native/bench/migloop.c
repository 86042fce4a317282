/* An MPI ping-pong that checks every answer, for live migration (issue 27).
 *
 *   mpirun -np 2 ./migloop SECONDS [STOPFILE]
 *
 * Rank 0 sends i, rank 1 answers 2i+1, for SECONDS of rank 0's clock, or
 * until STOPFILE exists on rank 0's node (looked for once a second: a test
 * ends the loop once what it checks during it is done); rank 0
 * checks each answer and keeps the longest time one round trip took (a guest
 * paused for its switch-over, or a network path that moved, shows there: rank
 * 0's clock runs on while rank 1's guest is paused). After 100 round trips it
 * prints "loop running"; at each whole second of its clock "loop at S s: N round
 * trips" (what part of a run went how fast: before and after a move); at the end
 * one line:
 *
 *   loop done: N round trips, W wrong, max gap G ms
 *
 * and exits 1 when an answer was wrong. Built by tests and `hpvc bench migrate
 * --slurm` with mpicc (hpvc.bench.migrate.slurm.build_loop).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static long answer(long v) { return 2 * v + 1; }

static void serve(void) {
    long v = 0;
    for (;;) {
        MPI_Recv(&v, 1, MPI_LONG, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (v < 0) return;
        v = answer(v);
        MPI_Send(&v, 1, MPI_LONG, 0, 0, MPI_COMM_WORLD);
    }
}

static int drive(double secs, const char *stop) {
    long i = 0, bad = 0, v = 0;
    double t0 = MPI_Wtime(), last = t0, gap = 0;
    int second = 0;
    for (;; i++) {
        double now = MPI_Wtime();
        if (now - last > gap) gap = now - last;
        last = now;
        while (now - t0 >= second + 1) {
            printf("loop at %d s: %ld round trips\n", ++second, i);
            fflush(stdout);
            if (stop != NULL && access(stop, F_OK) == 0)
                secs = 0; /* told to end: the next message ends rank 1 */
        }
        v = now - t0 < secs ? i : -1;
        MPI_Send(&v, 1, MPI_LONG, 1, 0, MPI_COMM_WORLD);
        if (v < 0) break;
        MPI_Recv(&v, 1, MPI_LONG, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (v != answer(i)) bad++;
        if (i == 100) {
            printf("loop running\n");
            fflush(stdout);
        }
    }
    printf("loop done: %ld round trips, %ld wrong, max gap %.1f ms\n", i, bad, gap * 1e3);
    fflush(stdout);
    return bad != 0;
}

int main(int argc, char **argv) {
    int rank = 0, rc = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double secs = argc > 1 ? atof(argv[1]) : 10.0;
    if (rank == 0)
        rc = drive(secs, argc > 2 ? argv[2] : NULL);
    else if (rank == 1)
        serve();
    MPI_Finalize();
    return rc;
}
