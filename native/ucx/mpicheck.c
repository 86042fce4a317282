/* mpicheck: an MPI job that fails loudly when messages arrive out of order, torn, or
 * stale; tests/integration/test_ucx_ivshmem.py runs it over libuct_ivshmem.so with
 * Open MPI (pml ucx) and MPICH (ch4:ucx).
 *
 *   mpicheck [ROUNDS]      in each of ROUNDS rounds every rank posts 8 sends at once
 *                          to the next rank of a ring, sizes cycling 8 B, 1 KiB,
 *                          64 KiB, 4 MiB (eager and rendezvous), each filled from
 *                          (sender, sequence number); the receiver takes them with
 *                          MPI_ANY_TAG and checks the order and every byte, then an
 *                          allreduce checks the sum of all ranks' counts.
 *   mpicheck die RANK      as above, but RANK kills itself (SIGKILL) in the middle
 *                          of a 4 MiB transfer: the job must end, not hang.
 *
 * Prints "mpicheck ok ranks=N rounds=R bytes=B" on rank 0; exits 1 on a wrong byte.
 */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const int sizes[] = {8, 1024, 65536, 4 << 20};
#define NSIZES (int)(sizeof sizes / sizeof sizes[0])

static void fill(unsigned char *buf, int len, int sender, int seq)
{
	for (int i = 0; i < len; i++) buf[i] = (unsigned char)(sender * 31 + seq * 7 + i);
	if (len >= 8) memcpy(buf, &seq, sizeof seq), memcpy(buf + 4, &sender, sizeof sender);
}

static int verify(const unsigned char *buf, int len, int sender, int seq)
{
	int got_seq, got_sender;
	if (len >= 8) {
		memcpy(&got_seq, buf, sizeof got_seq);
		memcpy(&got_sender, buf + 4, sizeof got_sender);
		if (got_seq != seq || got_sender != sender) {
			fprintf(stderr, "mpicheck: expected message %d from %d, got %d from %d\n", seq,
				sender, got_seq, got_sender);
			return -1;
		}
	}
	for (int i = 8; i < len; i++)
		if (buf[i] != (unsigned char)(sender * 31 + seq * 7 + i)) {
			fprintf(stderr, "mpicheck: message %d from %d: byte %d wrong\n", seq, sender, i);
			return -1;
		}
	return 0;
}

#define WINDOW (2 * NSIZES) /* messages in flight at once from each rank */

/* One window: WINDOW sends posted at once to `next`, the same number received in order
 * from `prev`; `die` kills this rank in the middle of it. Returns bytes, or -1. */
static long long window(int first, int next, int prev, int rank, int die, unsigned char **out,
			unsigned char *in)
{
	MPI_Request req[WINDOW];
	long long bytes = 0;
	for (int k = 0; k < WINDOW; k++) {
		int len = sizes[k % NSIZES];
		fill(out[k], len, rank, first + k);
		MPI_Isend(out[k], len, MPI_BYTE, next, first + k, MPI_COMM_WORLD, &req[k]);
	}
	if (rank == die && first > 0) raise(SIGKILL); /* its 4 MiB sends are on the way */
	for (int k = 0; k < WINDOW; k++) {
		int len = sizes[k % NSIZES];
		MPI_Recv(in, len, MPI_BYTE, prev, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		if (verify(in, len, prev, first + k) != 0) return -1;
		bytes += len;
	}
	MPI_Status done[WINDOW]; /* not MPI_STATUSES_IGNORE: GCC 12 misreads it in MPICH */
	MPI_Waitall(WINDOW, req, done);
	return bytes;
}

int main(int argc, char **argv)
{
	int rank, size, rounds = 5, die = -1, bad = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc == 3 && strcmp(argv[1], "die") == 0) die = atoi(argv[2]);
	else if (argc == 2) rounds = atoi(argv[1]);
	unsigned char *out[WINDOW], *in = malloc((size_t)sizes[NSIZES - 1]);
	for (int k = 0; k < WINDOW; k++) out[k] = malloc((size_t)sizes[k % NSIZES]);
	long long bytes = 0, total = 0;
	for (int r = 0; r < rounds && !bad; r++) {
		long long got = window(r * WINDOW, (rank + 1) % size, (rank + size - 1) % size, rank,
				       die, out, in);
		bad = got < 0;
		bytes += got < 0 ? 0 : got;
	}
	MPI_Allreduce(&bytes, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
	MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (rank == 0 && !bad && total == bytes * size)
		printf("mpicheck ok ranks=%d rounds=%d bytes=%lld\n", size, rounds, total);
	for (int k = 0; k < WINDOW; k++) free(out[k]);
	free(in);
	MPI_Finalize();
	return bad;
}
