/*
 * hpvc-nfsfuse: mount an NFS export through FUSE, from inside a node's
 * network namespace.
 *
 * Why hand-written: the host kernel hpvc runs on here has no NFS client
 * (no "nfs" in /proc/filesystems, modules cannot be loaded), and Debian
 * ships no FUSE NFS client (fuse-nfs is not packaged). FUSE works, and
 * libnfs speaks NFS in user space, so this small program glues the two:
 * FUSE's high-level (path) API maps one to one onto libnfs's path API.
 *
 *   hpvc-nfsfuse --netns /run/netns/N --server ADDR --export /shared
 *                --pidfile FILE [--log FILE] [--timeout SECONDS]
 *                [--nfs-port 2049] [--mount-port 20048] MOUNTPOINT
 *
 * 1. setns(CLONE_NEWNET) into --netns before anything else (no thread exists
 *    yet), so the NFS TCP connections live in the node's network namespace;
 *    the FUSE mount itself is made in this process's mount namespace.
 * 2. Mount the export: NFSv3 over TCP to fixed ports (no portmapper query).
 *    Failure: one line on stderr naming server, export and reason; exit 2.
 * 3. FUSE-mount MOUNTPOINT with allow_other and without default_permissions:
 *    the server checks permissions, with the caller's credentials (AUTH_SYS:
 *    uid, gid and up to 16 supplementary groups, taken from each request).
 * 4. Fork; the child writes --pidfile, answers FUSE's INIT, and only then
 *    lets the parent exit 0: when we return, the mount is live.
 *
 * Why NFSv3, not NFSv4: Debian's libnfs (4.0) marks its NFSv4 support "not
 * yet functional", and it is not: an NFSv4 WRITE of more than ~3.9 KiB
 * fails to encode (a 4 KiB buffer), a path utimes() breaks the next OPEN
 * (NFS4ERR_BAD_SEQID), a create ignores the mode, and leases are never
 * renewed. Its NFSv3 path is the mature one: 1 MiB READ/WRITE, no client
 * state, and a server restart is survived by reconnecting.
 *
 * One thread, one libnfs context: a libnfs 4.0 context is not thread-safe,
 * and per-thread contexts would each need a TCP connection of their own.
 * What carries the throughput is the size of each request: FUSE reads and
 * writes 1 MiB at a time (see widen_readahead), one NFS RPC each (libnfs
 * alone, 1 MiB per call, moved ~470 MB/s writes, ~1.4 GB/s cached reads on
 * the 2-core development machine; through FUSE about half of that). Writes
 * are answered once sent, several in flight (writebehind.c, which also runs
 * the event loop): a writing program does not wait for the server.
 *
 * Bounded failure: every RPC has a timeout (--timeout, default 10 s, whole
 * seconds: libnfs's unit). A server that stops answering fails each call
 * with ETIMEDOUT after that long. A lost connection (server killed or
 * restarted) fails the call with EIO at once; the next call reconnects,
 * at most one attempt a second, each attempt bounded by the timeout too
 * (libnfs's own reconnect loop is switched off: it retries forever and
 * never times out). NFSv3 file handles outlive the connection, so files
 * open across a server restart keep working.
 *
 * Long because it is one program around one piece of state: every FUSE
 * operation (a few lines each, mapping onto libnfs's path API) works on the
 * one libnfs context and the caller's credentials kept in this file, and
 * this comment says why the protocol and the design are what they are.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <getopt.h>
#include <limits.h>
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-zdr.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "nfsfuse.h"

#define MAX_IO (1u << 20) /* FUSE's largest request (256 pages) */
#define MAX_GROUPS 16     /* AUTH_SYS carries at most 16 groups */

static struct {
	const char *netns, *server, *export, *pidfile, *log, *mountpoint;
	int timeout_s, nfs_port, mount_port, trace;
} opt = {.timeout_s = 10, .nfs_port = 2049, .mount_port = 20048};

struct nfs_context *nfs;
int broken;                    /* the connection died: reconnect before the next call */
static int64_t last_attempt;   /* when the last reconnect was tried (ms, monotonic) */

/* The credentials the context's AUTH_SYS carries now. */
static struct {
	int valid, ngroups;
	uid_t uid;
	gid_t gid;
	gid_t groups[MAX_GROUPS];
} cred;

static void die(int code, const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(code);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct nfs_context *connect_export(const char **why);

/* A live connection, or -EIO: reconnect after a loss, one try a second. */
static int connected(void)
{
	struct nfs_context *fresh;
	const char *why;

	if (!broken)
		return 0;
	if (now_ms() - last_attempt < 1000)
		return -EIO;
	last_attempt = now_ms();
	fresh = connect_export(&why);
	if (fresh == NULL) {
		if (opt.trace)
			fprintf(stderr, PROG ": reconnect: %s\n", why);
		return -EIO;
	}
	nfs_destroy_context(nfs); /* open files keep their handles: NFSv3 has no state */
	nfs = fresh;
	broken = 0;
	cred.valid = 0;
	return 0;
}

/* The caller's uid, gid and groups on the context; rebuilt only on change. */
static void set_caller(void)
{
	struct fuse_context *c = fuse_get_context();
	gid_t groups[MAX_GROUPS];
	int n = fuse_getgroups(MAX_GROUPS, groups);
	struct AUTH *auth;

	if (n < 0) /* the caller is gone, or /proc unreadable: uid and gid only */
		n = 0;
	else if (n > MAX_GROUPS) /* more than AUTH_SYS carries: the first 16 */
		n = MAX_GROUPS;
	if (cred.valid && cred.uid == c->uid && cred.gid == c->gid && cred.ngroups == n &&
	    memcmp(cred.groups, groups, (size_t)n * sizeof(gid_t)) == 0)
		return;
	nfs_set_uid(nfs, (int)c->uid); /* keeps libnfs's own idea in step */
	nfs_set_gid(nfs, (int)c->gid);
	auth = libnfs_authunix_create("hpvc", c->uid, c->gid, (uint32_t)n, (uint32_t *)groups);
	if (auth == NULL) { /* out of memory: uid and gid only (set just above) */
		cred.valid = 0;
		return;
	}
	nfs_set_auth(nfs, auth);
	cred.valid = 1;
	cred.uid = c->uid;
	cred.gid = c->gid;
	cred.ngroups = n;
	memcpy(cred.groups, groups, (size_t)n * sizeof(gid_t));
}

/* Every operation starts here: a connection, with the caller's credentials. */
static int as_caller(void)
{
	int rc = connected();

	if (rc == 0)
		set_caller();
	return rc;
}

/*
 * libnfs returns 0 (or a count) or -errno. Two failures are its own, not the
 * server's: "Command timed out" (-EINTR, which would make a caller retry:
 * ETIMEDOUT instead), and a dead connection ("nfs_service failed", -EIO),
 * after which the context is useless: reconnect on the next call.
 */
static int err_at(int rc, const char *op)
{
	const char *why;

	if (rc >= 0)
		return 0;
	why = nfs_get_error(nfs);
	if (opt.trace)
		fprintf(stderr, PROG ": %s: %d %s\n", op, rc, why ? why : "");
	if (why && (strstr(why, "nfs_service failed") || strstr(why, "Socket")))
		broken = 1;
	if (rc == -EINTR)
		return why && strstr(why, "timed out") ? -ETIMEDOUT : -EIO;
	return rc > -4096 ? rc : -EIO;
}
#define err(rc) err_at((rc), __func__)
/* Every operation but a write: the writes in flight answered first
 * (writebehind.c), then a connection with the caller's credentials. */
#define ENTER()                          \
	do {                             \
		int rc_;                 \
		wb_drain();              \
		rc_ = as_caller();       \
		if (rc_ != 0)            \
			return rc_;      \
	} while (0)

static void to_stat(const struct nfs_stat_64 *n, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_dev = (dev_t)n->nfs_dev;
	st->st_ino = (ino_t)n->nfs_ino;
	st->st_mode = (mode_t)n->nfs_mode;
	st->st_nlink = (nlink_t)n->nfs_nlink;
	st->st_uid = (uid_t)n->nfs_uid;
	st->st_gid = (gid_t)n->nfs_gid;
	st->st_rdev = (dev_t)n->nfs_rdev;
	st->st_size = (off_t)n->nfs_size;
	st->st_blksize = MAX_IO;
	st->st_blocks = (blkcnt_t)((n->nfs_used + 511) / 512);
	st->st_atim.tv_sec = (time_t)n->nfs_atime;
	st->st_atim.tv_nsec = (long)n->nfs_atime_nsec;
	st->st_mtim.tv_sec = (time_t)n->nfs_mtime;
	st->st_mtim.tv_nsec = (long)n->nfs_mtime_nsec;
	st->st_ctim.tv_sec = (time_t)n->nfs_ctime;
	st->st_ctim.tv_nsec = (long)n->nfs_ctime_nsec;
}

static struct nf_file *file_of(const struct fuse_file_info *fi)
{
	return (struct nf_file *)(uintptr_t)fi->fh;
}

static struct nfsfh *fh_of(const struct fuse_file_info *fi)
{
	return file_of(fi)->fh;
}

/* fi->fh: the opened file, or -ENOMEM (the handle closed). */
static int opened(struct fuse_file_info *fi, struct nfsfh *fh)
{
	struct nf_file *f = calloc(1, sizeof(*f));

	if (f == NULL) {
		nfs_close(nfs, fh);
		return -ENOMEM;
	}
	f->fh = fh;
	f->through = (fi->flags & (O_SYNC | O_DSYNC | O_DIRECT)) != 0;
	/* A file opened only to write bypasses the page cache (FOPEN_DIRECT_IO):
	 * this daemon takes the bytes straight from the writer's buffer, on its
	 * own CPU. Through the cache, the writer's CPU copied each byte into a
	 * page it first allocated, pages dropped again at the file's next open
	 * (its mtime had changed: auto_cache below): 0.5 s of the writer's CPU
	 * per GiB, now 0.06 s (docs/storage.md). The kernel drops a reader's
	 * cached pages that a direct write passes. A buffer not page-aligned
	 * (Java's, Python's) spans 257 pages per MiB, so such a 1 MiB write
	 * comes as two requests (FUSE's 256 pages): two RPCs, both behind.
	 * A file opened to read keeps the cache (read-ahead, mmap). */
	fi->direct_io = (fi->flags & O_ACCMODE) == O_WRONLY;
	fi->fh = (uint64_t)(uintptr_t)f;
	return 0;
}

static int nf_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	struct nfs_stat_64 n;
	int rc;

	ENTER();
	rc = fi ? nfs_fstat64(nfs, fh_of(fi), &n) : nfs_lstat64(nfs, path, &n);
	if (rc < 0)
		return err(rc);
	to_stat(&n, st);
	return 0;
}

static int nf_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	struct nfsdir *dir;
	struct nfsdirent *e;
	int rc;

	(void)off, (void)fi, (void)flags;
	ENTER();
	rc = nfs_opendir(nfs, path, &dir);
	if (rc < 0)
		return err(rc);
	while ((e = nfs_readdir(nfs, dir)) != NULL) {
		struct stat st = {.st_ino = (ino_t)e->inode, .st_mode = (mode_t)e->mode};

		if (fill(buf, e->name, &st, 0, 0))
			break;
	}
	nfs_closedir(nfs, dir);
	return 0;
}

#define OPEN_FLAGS (O_ACCMODE | O_TRUNC | O_APPEND | O_SYNC | O_DSYNC)

static int nf_open(const char *path, struct fuse_file_info *fi)
{
	struct nfsfh *fh;
	int rc;

	ENTER();
	rc = nfs_open(nfs, path, fi->flags & OPEN_FLAGS, &fh);
	if (rc < 0)
		return err(rc);
	return opened(fi, fh);
}

static int nf_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct nfsfh *fh;
	int rc;

	ENTER();
	rc = nfs_create(nfs, path, fi->flags & (OPEN_FLAGS | O_EXCL), (int)(mode & 07777), &fh);
	if (rc == -EEXIST && !(fi->flags & O_EXCL)) /* made by another node meanwhile */
		rc = nfs_open(nfs, path, fi->flags & OPEN_FLAGS, &fh);
	if (rc < 0)
		return err(rc);
	return opened(fi, fh);
}

static int nf_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	wb_drain(); /* nothing in flight refers to the file when it is freed */
	/* libnfs commits a file written through the handle (COMMIT), then frees
	 * it: on a live connection (NFSv3 handles outlive a reconnect). With no
	 * connection to be had, the handle (a few hundred bytes) is left, not
	 * waited on: the file's close has already reported its writes' failure. */
	if (connected() == 0)
		nfs_close(nfs, fh_of(fi));
	free(file_of(fi));
	return 0;
}

/* close(2), of each descriptor of the file: its writes answered, their error. */
static int nf_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	return wb_flush(file_of(fi));
}

static int nf_read(const char *path, char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	int rc;

	(void)path;
	ENTER();
	rc = nfs_pread(nfs, fh_of(fi), (uint64_t)off, size, buf);
	return rc < 0 ? err(rc) : rc;
}

/* Answered once sent: writebehind.c (its errors come on a later call);
 * on a file opened O_SYNC or O_DSYNC (libnfs then sends FILE_SYNC writes),
 * only once the server has answered: such a write must be on its disk; and
 * on one opened O_DIRECT, whose writes must not wait in a client's buffer
 * (as the kernel's NFS client does: a program timing its I/O, fio --direct,
 * measures the server, not the buffer). */
static int nf_write(const char *path, const char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct nf_file *f = file_of(fi);
	int rc = as_caller();

	if (rc != 0)
		return rc;
	rc = wb_write(f, path, buf, size, off);
	if (rc >= 0 && f->through) {
		int e = wb_flush(f);

		return e != 0 ? e : rc;
	}
	return rc;
}

/* COMMIT: writes are sent UNSTABLE (seen by every node at once, on the
 * server's disk once committed), like the kernel's NFS client does. */
static int nf_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	int e;

	(void)path, (void)datasync;
	ENTER();
	e = wb_flush(file_of(fi));
	return e != 0 ? e : err(nfs_fsync(nfs, fh_of(fi)));
}

static int nf_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	ENTER();
	return err(fi ? nfs_ftruncate(nfs, fh_of(fi), (uint64_t)size)
		      : nfs_truncate(nfs, path, (uint64_t)size));
}

static int nf_unlink(const char *path)
{
	ENTER();
	return err(nfs_unlink(nfs, path));
}

static int nf_mkdir(const char *path, mode_t mode)
{
	ENTER();
	return err(nfs_mkdir2(nfs, path, (int)(mode & 07777)));
}

static int nf_rmdir(const char *path)
{
	ENTER();
	return err(nfs_rmdir(nfs, path));
}

static int nf_rename(const char *from, const char *to, unsigned int flags)
{
	if (flags != 0) /* RENAME_NOREPLACE / RENAME_EXCHANGE: NFS has neither */
		return -EINVAL;
	ENTER();
	return err(nfs_rename(nfs, from, to));
}

static int nf_link(const char *from, const char *to)
{
	ENTER();
	return err(nfs_link(nfs, from, to));
}

static int nf_symlink(const char *target, const char *path)
{
	ENTER();
	return err(nfs_symlink(nfs, target, path));
}

static int nf_readlink(const char *path, char *buf, size_t size)
{
	int rc;

	if (size > INT_MAX)
		size = INT_MAX;
	ENTER();
	memset(buf, 0, size);
	rc = nfs_readlink(nfs, path, buf, (int)size);
	if (rc < 0)
		return err(rc);
	buf[size - 1] = '\0';
	return 0;
}

static int nf_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	ENTER();
	return err(fi ? nfs_fchmod(nfs, fh_of(fi), (int)(mode & 07777))
		      : nfs_lchmod(nfs, path, (int)(mode & 07777)));
}

static int nf_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	ENTER();
	/* -1 ("leave it") is what NFSv3's SETATTR says with set_it false: libnfs
	 * sends an id only when it is not -1 */
	return err(fi ? nfs_fchown(nfs, fh_of(fi), (int)uid, (int)gid)
		      : nfs_lchown(nfs, path, (int)uid, (int)gid));
}

static int nf_utimens(const char *path, const struct timespec ts[2], struct fuse_file_info *fi)
{
	struct timeval tv[2];
	struct nfs_stat_64 n = {0};
	int i, rc;

	if (path == NULL)
		return -ENOTSUP; /* libnfs has no futimes; only an unlinked open file lands here */
	ENTER();
	if (ts[0].tv_nsec == UTIME_OMIT || ts[1].tv_nsec == UTIME_OMIT) {
		rc = fi ? nfs_fstat64(nfs, fh_of(fi), &n) : nfs_lstat64(nfs, path, &n);
		if (rc < 0)
			return err(rc);
	}
	for (i = 0; i < 2; i++) {
		if (ts[i].tv_nsec == UTIME_NOW) {
			gettimeofday(&tv[i], NULL);
		} else if (ts[i].tv_nsec == UTIME_OMIT) {
			tv[i].tv_sec = (time_t)(i ? n.nfs_mtime : n.nfs_atime);
			tv[i].tv_usec = (suseconds_t)((i ? n.nfs_mtime_nsec : n.nfs_atime_nsec) / 1000);
		} else {
			tv[i].tv_sec = ts[i].tv_sec;
			tv[i].tv_usec = ts[i].tv_nsec / 1000;
		}
	}
	return err(nfs_lutimes(nfs, path, tv));
}

static int nf_statfs(const char *path, struct statvfs *st)
{
	struct nfs_statvfs_64 s;
	int rc;

	ENTER();
	rc = nfs_statvfs64(nfs, path, &s);
	if (rc < 0)
		return err(rc);
	memset(st, 0, sizeof(*st));
	st->f_bsize = (unsigned long)s.f_bsize;
	st->f_frsize = (unsigned long)s.f_frsize;
	st->f_blocks = (fsblkcnt_t)s.f_blocks;
	st->f_bfree = (fsblkcnt_t)s.f_bfree;
	st->f_bavail = (fsblkcnt_t)s.f_bavail;
	st->f_files = (fsfilcnt_t)s.f_files;
	st->f_ffree = (fsfilcnt_t)s.f_ffree;
	st->f_favail = (fsfilcnt_t)s.f_favail;
	st->f_namemax = (unsigned long)s.f_namemax;
	return 0;
}

static int nf_access(const char *path, int mask)
{
	ENTER();
	return err(nfs_access(nfs, path, mask));
}

static void *nf_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	uint64_t wmax = nfs_get_writemax(nfs), rmax = nfs_get_readmax(nfs);

	conn->max_write = wmax && wmax < MAX_IO ? (unsigned)wmax : MAX_IO;
	conn->max_readahead = rmax && rmax < MAX_IO ? (unsigned)rmax : MAX_IO;
	cfg->use_ino = 1;          /* the server's inode numbers */
	cfg->hard_remove = 0;      /* NFSv3 has no open state: an unlinked open file is
				      renamed .fuse_hidden* until closed (NFS's silly rename) */
	cfg->auto_cache = 1;       /* cached data stays while mtime and size do */
	cfg->attr_timeout = 1.0;   /* other nodes' changes show within a second */
	cfg->entry_timeout = 1.0;
	cfg->negative_timeout = 0; /* a file made by another node shows at once */
	return NULL;
}

static const struct fuse_operations ops = {
	.init = nf_init,
	.getattr = nf_getattr,
	.readdir = nf_readdir,
	.open = nf_open,
	.create = nf_create,
	.release = nf_release,
	.flush = nf_flush,
	.read = nf_read,
	.write = nf_write,
	.fsync = nf_fsync,
	.truncate = nf_truncate,
	.unlink = nf_unlink,
	.mkdir = nf_mkdir,
	.rmdir = nf_rmdir,
	.rename = nf_rename,
	.link = nf_link,
	.symlink = nf_symlink,
	.readlink = nf_readlink,
	.chmod = nf_chmod,
	.chown = nf_chown,
	.utimens = nf_utimens,
	.statfs = nf_statfs,
	.access = nf_access,
};

static void usage(void)
{
	die(2, "usage: " PROG " --netns PATH --server ADDR --export PATH --pidfile FILE"
	       " [--log FILE] [--timeout SECONDS] [--nfs-port N] [--mount-port N] MOUNTPOINT");
}

static int number(const char *name, const char *text, int lo, int hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < lo || v > hi)
		die(2, "--%s %s: want a whole number from %d to %d", name, text, lo, hi);
	return (int)v;
}

static void parse(int argc, char **argv)
{
	static const struct option longs[] = {
		{"netns", required_argument, NULL, 'n'},
		{"server", required_argument, NULL, 's'},
		{"export", required_argument, NULL, 'e'},
		{"pidfile", required_argument, NULL, 'p'},
		{"log", required_argument, NULL, 'l'},
		{"timeout", required_argument, NULL, 't'},
		{"nfs-port", required_argument, NULL, 'N'},
		{"mount-port", required_argument, NULL, 'M'},
		{NULL, 0, NULL, 0},
	};
	int c;

	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (c) {
		case 'n': opt.netns = optarg; break;
		case 's': opt.server = optarg; break;
		case 'e': opt.export = optarg; break;
		case 'p': opt.pidfile = optarg; break;
		case 'l': opt.log = optarg; break;
		case 't': opt.timeout_s = number("timeout", optarg, 1, 3600); break;
		case 'N': opt.nfs_port = number("nfs-port", optarg, 1, 65535); break;
		case 'M': opt.mount_port = number("mount-port", optarg, 1, 65535); break;
		default: usage();
		}
	}
	if (optind != argc - 1 || !opt.netns || !opt.server || !opt.export || !opt.pidfile)
		usage();
	opt.mountpoint = argv[optind];
	if (opt.export[0] != '/' || strpbrk(opt.export, "?&") || strpbrk(opt.server, "/?&@"))
		die(2, "cannot mount %s:%s: want an address and an absolute path", opt.server,
		    opt.export);
	opt.trace = getenv("HPVC_NFSFUSE_DEBUG") ? atoi(getenv("HPVC_NFSFUSE_DEBUG")) : 0;
}

static void enter_netns(void)
{
	int fd = open(opt.netns, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		die(2, "network namespace %s: %s", opt.netns, strerror(errno));
	if (setns(fd, CLONE_NEWNET) != 0)
		die(2, "enter network namespace %s: %s", opt.netns, strerror(errno));
	close(fd);
}

/* A context mounted on the export, or NULL and why (see connected()). */
static struct nfs_context *connect_export(const char **why)
{
	static char error[512];
	struct nfs_context *c = nfs_init_context();
	struct nfs_url *u;
	char url[1024];

	*why = "out of memory";
	if (c == NULL)
		return NULL;
	/* The ports go in as URL arguments: libnfs 4.0 has no setter for them. */
	snprintf(url, sizeof(url), "nfs://%s%s?version=3&nfsport=%d&mountport=%d", opt.server,
		 opt.export, opt.nfs_port, opt.mount_port);
	u = nfs_parse_url_dir(c, url);
	if (u != NULL) {
		if (opt.trace > 1) /* failures (1), and libnfs's trace (2 and up), to --log */
			nfs_set_debug(c, opt.trace - 1);
		nfs_set_autoreconnect(c, 0);
		nfs_set_timeout(c, opt.timeout_s * 1000);
		nfs_set_dircache(c, 0); /* one context serves every user: cache nothing */
		nfs_umask(c, 0);        /* the kernel applied the caller's umask already */
		nfs_set_uid(c, 0);
		nfs_set_gid(c, 0);
		if (nfs_mount(c, u->server, u->path) == 0) {
			nfs_destroy_url(u);
			return c;
		}
		nfs_destroy_url(u);
	}
	snprintf(error, sizeof(error), "%s", nfs_get_error(c) ? nfs_get_error(c) : "failed");
	if (strstr(error, "nfs_service failed")) /* libnfs's word for a dead connection */
		snprintf(error, sizeof(error), "no connection to ports %d (NFS) and %d (MOUNT)"
			 " over TCP: no server there, or no route", opt.nfs_port, opt.mount_port);
	*why = error;
	nfs_destroy_context(c);
	return NULL;
}

static void write_pidfile(void)
{
	FILE *f = fopen(opt.pidfile, "we");

	if (f == NULL || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0)
		die(1, "pid file %s: %s", opt.pidfile, strerror(errno));
}

/*
 * The kernel reads ahead on a FUSE mount no more than its backing device's
 * read_ahead_kb (128 KiB), whatever max_readahead says, so sequential reads
 * came as 128 KiB requests, one RPC each. The mount's own device (made with
 * it, gone with it) is given MAX_IO instead: reads of 1 MiB. Best effort.
 */
static void widen_readahead(void)
{
	char line[4096], path[PATH_MAX], dev[32], bdi[96];
	unsigned int maj, min;
	FILE *f = fopen("/proc/self/mountinfo", "re");

	if (f == NULL || realpath(opt.mountpoint, path) == NULL) {
		if (f)
			fclose(f);
		return;
	}
	dev[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		char target[PATH_MAX];

		/* "ID PARENT MAJ:MIN ROOT TARGET ...": a target with spaces is
		 * escaped (\040), so it cannot match a path that has some: skip. */
		if (sscanf(line, "%*s %*s %u:%u %*s %4095s", &maj, &min, target) == 3 &&
		    strcmp(target, path) == 0)
			snprintf(dev, sizeof(dev), "%u:%u", maj, min);
	}
	fclose(f);
	if (dev[0] == '\0')
		return;
	snprintf(bdi, sizeof(bdi), "/sys/class/bdi/%s/read_ahead_kb", dev);
	f = fopen(bdi, "we");
	if (f != NULL) {
		fprintf(f, "%u\n", MAX_IO >> 10);
		fclose(f);
	}
}

/* Fork; the parent exits 0 once the child has answered FUSE's INIT (the
 * mount is live), or 1 when the child died first. */
static void daemonize(struct fuse_session *se)
{
	struct fuse_buf buf = {0};
	int fds[2], null, out, rc;
	pid_t pid;
	char ok;

	if (pipe2(fds, O_CLOEXEC) != 0)
		die(1, "pipe: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		die(1, "fork: %s", strerror(errno));
	if (pid > 0) {
		close(fds[1]);
		_exit(read(fds[0], &ok, 1) == 1 ? 0 : 1);
	}
	close(fds[0]);
	setsid();
	if (chdir("/") != 0)
		die(1, "chdir /: %s", strerror(errno));
	write_pidfile();
	rc = fuse_session_receive_buf(se, &buf); /* the first request is INIT */
	if (rc <= 0)
		die(1, "FUSE INIT: %s", rc < 0 ? strerror(-rc) : "unmounted");
	fuse_session_process_buf(se, &buf);
	free(buf.mem);
	widen_readahead();
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	out = opt.log ? open(opt.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : null;
	if (null < 0 || out < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(out, 2) < 0)
		die(1, "redirect output: %s", strerror(errno));
	if (write(fds[1], "", 1) != 1)
		_exit(1);
	close(fds[1]);
}

int main(int argc, char **argv)
{
	char mopts[600];
	char *fargv[] = {PROG, "-o", mopts, NULL};
	struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
	struct fuse_session *se;
	struct fuse *f;
	const char *why;
	int rc;

	parse(argc, argv);
	enter_netns(); /* first: no thread exists yet, and every socket is made inside */
	nfs = connect_export(&why);
	if (nfs == NULL)
		die(2, "cannot mount %s:%s: %s", opt.server, opt.export, why);
	snprintf(mopts, sizeof(mopts), "allow_other,subtype=hpvc-nfs,fsname=%s:%s", opt.server,
		 opt.export);
	f = fuse_new(&args, &ops, sizeof(ops), NULL);
	if (f == NULL)
		die(1, "fuse_new failed");
	if (fuse_mount(f, opt.mountpoint) != 0)
		die(1, "cannot mount FUSE at %s", opt.mountpoint);
	se = fuse_get_session(f);
	if (fuse_set_signal_handlers(se) != 0)
		die(1, "signal handlers");
	daemonize(se);
	rc = wb_loop(se); /* one thread: see the top of this file */
	fuse_remove_signal_handlers(se);
	fuse_unmount(f);
	fuse_destroy(f);
	nfs_destroy_context(nfs);
	unlink(opt.pidfile);
	return rc < 0 ? 1 : 0;
}
