/*
 * hpvc-nfsfuse's write-behind: a write is answered as soon as it is sent.
 *
 * Without it, every write(2) on the mount waited for its NFS WRITE's reply.
 * FUSE without its writeback cache hands the daemon one write at a time and
 * waits for the answer, and the answer came after the round trip through
 * the node's network to the server and back: ~1.3 ms per 1 MiB here, time
 * in which the writing program (a Spark task writing its output) stood
 * still. Now the data is copied, the WRITE is queued on the libnfs context
 * (its async API) and the write is answered with its size; the loop below
 * serves the connection while writes are in flight, so they go out while
 * the program goes on. The kernel's own NFS client writes behind too (from
 * its page cache), and this keeps its promises:
 *
 *  - A write's error (ENOSPC, EDQUOT, EIO, a lost connection) comes back on
 *    the file's next write, fsync or close (FUSE's flush), once. close(2)
 *    returns only when every write sent is answered. A file opened O_SYNC,
 *    O_DSYNC or O_DIRECT waits for each write's answer (nf_write).
 *  - Bounded: at most WB_BYTES bytes and WB_REQS writes in flight per mount;
 *    a write beyond them waits for earlier ones.
 *  - Order: every other operation (read, getattr, rename, truncate, ...)
 *    first waits for all writes in flight, so nothing sees a file before
 *    its writes land; a write overlapping one in flight to the same path
 *    waits for it, so that two writes of the same bytes land in the order
 *    they were made (the server may run requests in flight in any order).
 *  - A connection that dies: the writes in flight fail (EIO), the context is
 *    replaced by an unmounted one and the next call reconnects
 *    (connected() in hpvc-nfsfuse.c). A server that stops answering fails
 *    them after the RPC timeout (--timeout): libnfs checks it each time the
 *    connection is served, at least every SERVICE_MS while writes wait. A
 *    write that timed out ends the connection too: libnfs 4.0 drops a timed
 *    out request even when half of it is sent (rpc_timeout_scan), and the
 *    half record left in the stream would make every later request
 *    garbage to the server.
 *
 * Why not FUSE's own writeback cache: with it the kernel keeps its cached
 * size and mtime of a file over what the server says (fuse_get_cache_mask),
 * so a file another node appends to would keep its old size on this one.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <errno.h>
#include <fuse_lowlevel.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nfsfuse.h"

#define WB_BYTES (8u << 20) /* eight of FUSE's largest writes */
#define WB_REQS 64u
#define SERVICE_MS 100 /* libnfs checks RPC timeouts when served: this often at least */

struct wb_req {
	struct nf_file *f;
	char *path; /* NULL: not known, conflicts with every write */
	off_t off;
	size_t size;
	struct wb_req *prev, *next;
	char data[];
};

static struct wb_req *inflight; /* the writes not answered yet */
static size_t bytes;
static unsigned reqs;
static int poisoned; /* a write timed out or was cancelled: the stream is not to be trusted */

/*
 * The errno of a failed WRITE. libnfs hands the callback -EFAULT for a
 * server's refusal and keeps its reason only in the context's error string
 * ("NFS: Write failed with NFS3ERR_NOSPC(-28)"), -EINTR for a cancel or a
 * timeout, -ENOMEM for its own allocations.
 */
static int write_errno(struct nfs_context *c, int status)
{
	const char *why = nfs_get_error(c), *at;
	long e;

	if (status == -EFAULT && why != NULL && (at = strstr(why, "Write failed with ")) != NULL &&
	    (at = strchr(at, '(')) != NULL) {
		e = strtol(at + 1, NULL, 10);
		if (e < 0 && e > -4096)
			return (int)e;
	}
	return status == -ENOMEM ? -ENOMEM : -EIO;
}

static void wb_done(int status, struct nfs_context *c, void *data, void *priv)
{
	struct wb_req *r = priv;

	(void)data;
	if (status == -EINTR)
		poisoned = 1;
	if (r->f->error == 0) {
		if (status < 0)
			r->f->error = write_errno(c, status);
		else if ((size_t)status != r->size)
			r->f->error = -EIO;
	}
	bytes -= r->size;
	reqs--;
	if (r->prev)
		r->prev->next = r->next;
	else
		inflight = r->next;
	if (r->next)
		r->next->prev = r->prev;
	free(r->path);
	free(r);
}

/*
 * The connection is dead: destroying the context calls back every request
 * in flight as cancelled (they fail, EIO); an unmounted context stands in
 * until connected() makes a new one.
 */
static void abandon(void)
{
	struct nfs_context *dead = nfs, *standin = nfs_init_context();

	if (standin == NULL) {
		fputs(PROG ": out of memory after losing the connection\n", stderr);
		exit(1);
	}
	nfs_set_timeout(standin, nfs_get_timeout(dead)); /* a call on it fails in bounded time */
	broken = 1;
	nfs = standin;
	nfs_destroy_context(dead);
	poisoned = 0;
}

/* Serve the connection with what poll(2) said; end it when dead or poisoned. */
static void serve(int revents)
{
	if (nfs_service(nfs, revents) < 0 || poisoned)
		abandon();
}

/* Serve the connection until at most max_bytes and max_reqs are in flight. */
static void wait_below(size_t max_bytes, unsigned max_reqs)
{
	while (reqs > max_reqs || bytes > max_bytes) {
		struct pollfd p = {.fd = nfs_get_fd(nfs), .events = (short)nfs_which_events(nfs)};

		if (poll(&p, 1, SERVICE_MS) < 0 && errno != EINTR) {
			abandon();
			return;
		}
		serve(p.revents);
	}
}

void wb_drain(void)
{
	wait_below(0, 0);
}

int wb_flush(struct nf_file *f)
{
	int e;

	wb_drain();
	e = f->error;
	f->error = 0;
	return e;
}

static int overlaps(const char *path, off_t off, size_t size)
{
	const struct wb_req *r;

	for (r = inflight; r != NULL; r = r->next)
		if (r->path == NULL || path == NULL ||
		    (strcmp(r->path, path) == 0 && off < r->off + (off_t)r->size &&
		     r->off < off + (off_t)size))
			return 1;
	return 0;
}

int wb_write(struct nf_file *f, const char *path, const char *buf, size_t size, off_t off)
{
	struct wb_req *r;
	int e;

	if (overlaps(path, off, size))
		wb_drain();
	wait_below(WB_BYTES - (size < WB_BYTES ? size : WB_BYTES), WB_REQS - 1);
	e = f->error; /* an earlier write's failure: this one is not sent */
	if (e != 0) {
		f->error = 0;
		return e;
	}
	if (broken)
		return -EIO;
	r = malloc(sizeof(*r) + size);
	if (r == NULL)
		return -ENOMEM;
	r->f = f;
	r->off = off;
	r->size = size;
	r->path = path ? strdup(path) : NULL;
	memcpy(r->data, buf, size);
	if (nfs_pwrite_async(nfs, f->fh, (uint64_t)off, size, r->data, wb_done, r) != 0) {
		free(r->path);
		free(r);
		return -EIO;
	}
	r->prev = NULL;
	r->next = inflight;
	if (inflight)
		inflight->prev = r;
	inflight = r;
	bytes += size;
	reqs++;
	return (int)size;
}

/*
 * fuse_session_loop, which also serves the NFS connection while writes are
 * in flight: poll(2) on /dev/fuse and, then, on the connection's socket.
 */
int wb_loop(struct fuse_session *se)
{
	struct fuse_buf buf = {0};
	int rc = 0;

	while (!fuse_session_exited(se)) {
		struct pollfd p[2] = {{.fd = fuse_session_fd(se), .events = POLLIN}};
		nfds_t n = 1;

		if (reqs > 0) {
			p[1].fd = nfs_get_fd(nfs);
			p[1].events = (short)nfs_which_events(nfs);
			n = 2;
		}
		if (poll(p, n, n == 2 ? SERVICE_MS : -1) < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		if (n == 2)
			serve(p[1].revents);
		if (p[0].revents == 0)
			continue;
		rc = fuse_session_receive_buf(se, &buf);
		if (rc == -EINTR)
			continue;
		if (rc <= 0) /* 0: unmounted */
			break;
		fuse_session_process_buf(se, &buf);
		rc = 0;
	}
	free(buf.mem);
	wb_drain();
	return rc < 0 ? rc : 0;
}
