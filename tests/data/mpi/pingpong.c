/* A long MPI ping-pong with a known result (tests/integration/test_checkpoint_vm.py).
 *
 * Rank 0 sends i, rank 1 answers 2*i+1, for i = 0..N-1, sleeping DELAY_US
 * between rounds so the loop lasts long enough to be checkpointed mid-run.
 * Rank 0 checks every answer (a lost or repeated message stops it, exit 3)
 * and ends with "DONE N SUM": SUM is the sum of the answers, N*N.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void serve(int n, int delay_us)
{
	for (int i = 0; i < n; i++) {
		int v;
		MPI_Recv(&v, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		v = 2 * v + 1;
		MPI_Send(&v, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
		usleep(delay_us);
	}
}

static long long ask(int n, int delay_us)
{
	long long sum = 0;
	for (int i = 0; i < n; i++) {
		int v = i;
		MPI_Send(&v, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
		MPI_Recv(&v, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		if (v != 2 * i + 1) {
			printf("BAD round %d: got %d, want %d\n", i, v, 2 * i + 1);
			fflush(stdout);
			MPI_Abort(MPI_COMM_WORLD, 3);
		}
		sum += v;
		if (i % 50 == 0) {
			printf("round %d\n", i);
			fflush(stdout);
		}
		usleep(delay_us);
	}
	return sum;
}

int main(int argc, char **argv)
{
	int rank;
	int n = argc > 1 ? atoi(argv[1]) : 1000;
	int delay_us = argc > 2 ? atoi(argv[2]) : 10000;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank == 0) {
		long long sum = ask(n, delay_us);
		printf("DONE %d %lld\n", n, sum);
		fflush(stdout);
	} else if (rank == 1) {
		serve(n, delay_us);
	}
	MPI_Finalize();
	return 0;
}
