/* Slurm's PMIx server, reachable from inside the nodes (remote context,
 * task_post_fork, in slurmstepd, at the step's first task on each host, before
 * any task runs; docs/slurm.md, "MPI").
 *
 * Slurm 22.05's mpi/pmix starts the step's PMIx 4 server in slurmstepd before
 * user_init and tells each task where it listens in PMIX_SERVER_URI*:
 * "pmix-server.<pid>;tcp4://127.0.0.1:<port>", the host's loopback (the
 * server is libpmix inside slurmstepd; server_port finds its socket). A task
 * that joins its node's network namespace cannot reach that. So this file
 * starts one forwarder per step per host: for each container node of the
 * share it makes a listening socket on 127.0.0.1:<port> *inside the node's
 * network namespace* (setns there, socket, bind, listen, setns back), and
 * for each connection a task makes there it connects to the host's
 * 127.0.0.1:<port> from the host's namespace and copies bytes both ways.
 * The client sees the very address in its environment. Nothing new listens
 * in the host's namespace: only processes inside a node (the job's own
 * tasks) reach its listener.
 *
 * The forwarder is a child of slurmstepd: it makes its listeners as root,
 * then takes the job user's ids for good (it only needs connect() to the
 * host's loopback, which any user has), and dies with slurmstepd
 * (parent-death signal); Slurm's process tracking kills it with the step's
 * other processes when the step ends. Hand-written, not a library: a
 * loopback byte copy is a poll loop, and no packaged relay can make its
 * listener in another network namespace. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hpvc_spank.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define FWD_BUF 65536
#define FWD_MAX 1024 /* connections at once: one per task, HPVC_MAX_TASKS at most */

/* One task's connection: a = the task's (node side), b = the server's (host side). */
struct pair {
	int fd[2];
	char *buf[2]; /* buf[0]: read from a, to write to b; buf[1]: b to a */
	size_t len[2], off[2];
	int eof[2];
};

/* The inodes of this process's sockets (slurmstepd's), into ino; how many. */
static int own_sockets(unsigned long *ino, int max)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	struct dirent *e;
	while (d != NULL && n < max && (e = readdir(d)) != NULL) {
		char path[64], link[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%.16s", e->d_name);
		ssize_t len = readlink(path, link, sizeof(link) - 1);
		if (len <= 0)
			continue;
		link[len] = '\0';
		if (sscanf(link, "socket:[%lu]", &ino[n]) == 1)
			n++;
	}
	if (d != NULL)
		closedir(d);
	return n;
}

/* The port of the step's PMIx server: the one TCP socket of slurmstepd's
 * (libpmix runs inside it) listening on 127.0.0.1; Slurm's own PMIx
 * collectives listen on every address, not the loopback. The tasks'
 * PMIX_SERVER_URI* ("...;tcp4://127.0.0.1:<port>") are set in each task after
 * this hook, so they cannot be read here. 0 if there is not exactly one. */
static int server_port(void)
{
	static unsigned long ino[4096];
	int nino = own_sockets(ino, (int)(sizeof(ino) / sizeof(ino[0])));
	FILE *f = fopen("/proc/self/net/tcp", "re");
	char line[512];
	int port = 0, found = 0;
	while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
		unsigned int addr, lport, state;
		unsigned long inode;
		if (sscanf(line, " %*u: %x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &addr, &lport,
			   &state, &inode) != 4 ||
		    state != 0x0A /* LISTEN */ || addr != htonl(INADDR_LOOPBACK))
			continue;
		for (int i = 0; i < nino; i++)
			if (ino[i] == inode) {
				port = (int)lport;
				found++;
			}
	}
	if (f != NULL)
		fclose(f);
	return found == 1 ? port : 0;
}

static void say(int fd, const char *msg)
{
	size_t len = strlen(msg);
	while (len > 0) {
		ssize_t n = write(fd, msg, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		msg += n;
		len -= (size_t)n;
	}
}

static void close_pair(struct pair *p)
{
	for (int d = 0; d < 2; d++) {
		close(p->fd[d]);
		free(p->buf[d]);
	}
	free(p);
}

/* Move what can be moved in direction d (from fd[d] to fd[1-d]); -1 when the
 * connection is done for (an error, or both directions ended and drained). */
static int pump(struct pair *p, int d, short rev_from, short rev_to)
{
	/* An error, or a side hung up after its end was read: nothing more to move. */
	if ((rev_from & POLLERR) || (p->eof[d] && (rev_from & POLLHUP)))
		return -1;
	if (p->len[d] == 0 && !p->eof[d] && (rev_from & (POLLIN | POLLHUP | POLLERR))) {
		ssize_t n = read(p->fd[d], p->buf[d], FWD_BUF);
		if (n > 0) {
			p->len[d] = (size_t)n;
			p->off[d] = 0;
		} else if (n == 0) {
			p->eof[d] = 1;
			shutdown(p->fd[1 - d], SHUT_WR);
		} else if (errno != EAGAIN && errno != EINTR) {
			return -1;
		}
	}
	if (p->len[d] > 0 && (rev_to & (POLLOUT | POLLERR | POLLHUP))) {
		ssize_t n = write(p->fd[1 - d], p->buf[d] + p->off[d], p->len[d]);
		if (n > 0) {
			p->off[d] += (size_t)n;
			p->len[d] -= (size_t)n;
			if (p->len[d] == 0 && p->eof[d])
				shutdown(p->fd[1 - d], SHUT_WR);
		} else if (n < 0 && errno != EAGAIN && errno != EINTR) {
			return -1;
		}
	}
	return (p->eof[0] && p->eof[1] && p->len[0] == 0 && p->len[1] == 0) ? -1 : 0;
}

/* A task connected to listener l: connect to the server from the host's
 * namespace (where this process lives) and add the pair. */
static void accept_one(int l, const struct sockaddr_in *server, struct pair **pairs, int *npairs)
{
	int a = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (a < 0)
		return;
	int b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct pair *p = *npairs < FWD_MAX ? calloc(1, sizeof(*p)) : NULL;
	if (b < 0 || p == NULL || connect(b, (const struct sockaddr *)server, sizeof(*server)) < 0 ||
	    fcntl(b, F_SETFL, O_NONBLOCK) < 0 || (p->buf[0] = malloc(FWD_BUF)) == NULL ||
	    (p->buf[1] = malloc(FWD_BUF)) == NULL) {
		close(a); /* the task's client sees the connection end, as with no server */
		if (b >= 0)
			close(b);
		if (p != NULL) {
			free(p->buf[0]);
			free(p);
		}
		return;
	}
	p->fd[0] = a;
	p->fd[1] = b;
	pairs[(*npairs)++] = p;
}

static void __attribute__((noreturn)) serve(const int *listeners, int nl, int port)
{
	struct sockaddr_in server = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	static struct pair *pairs[FWD_MAX];
	static struct pollfd pfd[HPVC_MAX_TASKS + 2 * FWD_MAX];
	int npairs = 0;
	for (;;) {
		int n = 0;
		for (int i = 0; i < nl; i++)
			pfd[n++] = (struct pollfd){ .fd = listeners[i], .events = POLLIN };
		for (int i = 0; i < npairs; i++) {
			struct pair *p = pairs[i];
			for (int d = 0; d < 2; d++) {
				short ev = 0;
				if (p->len[d] == 0 && !p->eof[d])
					ev |= POLLIN;
				if (p->len[1 - d] > 0)
					ev |= POLLOUT;
				pfd[n++] = (struct pollfd){ .fd = p->fd[d], .events = ev };
			}
		}
		if (poll(pfd, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			_exit(1);
		}
		int had = npairs;
		for (int i = 0, k = nl; i < had; i++, k += 2) {
			struct pair *p = pairs[i];
			short ra = pfd[k].revents, rb = pfd[k + 1].revents;
			if (pump(p, 0, ra, rb) < 0 || pump(p, 1, rb, ra) < 0) {
				close_pair(p);
				pairs[i] = NULL;
			}
		}
		int kept = 0;
		for (int i = 0; i < had; i++)
			if (pairs[i] != NULL)
				pairs[kept++] = pairs[i];
		npairs = kept;
		for (int i = 0; i < nl; i++)
			if (pfd[i].revents & POLLIN)
				accept_one(listeners[i], &server, pairs, &npairs);
	}
}

/* A listener on 127.0.0.1:port inside the network namespace of the process
 * behind pidfd; this process goes back to the host's (hostns) after. */
static int listen_in(int pidfd, int hostns, int port, char *err, size_t size, const char *node)
{
	if (setns(pidfd, CLONE_NEWNET) < 0) {
		snprintf(err, size, "cannot enter node %s's network: %s", node, strerror(errno));
		return -1;
	}
	struct sockaddr_in at = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int one = 1;
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(l, (struct sockaddr *)&at, sizeof(at)) < 0 || listen(l, 128) < 0) {
		snprintf(err, size, "cannot listen on 127.0.0.1:%d in node %s: %s", port, node,
			 strerror(errno));
		if (l >= 0)
			close(l);
		l = -1;
	}
	if (setns(hostns, CLONE_NEWNET) < 0) {
		snprintf(err, size, "cannot go back to the host's network: %s", strerror(errno));
		return -1;
	}
	return l;
}

/* The forwarder (a child of slurmstepd): root again to make the listeners,
 * then the job user's ids; says "ok" or the error on fd tell. */
static void __attribute__((noreturn)) forwarder(int tell, pid_t stepd, int port, uid_t uid, gid_t gid)
{
	static int listeners[HPVC_MAX_TASKS];
	char err[512] = "";
	int nl = 0;
	/* Nothing of slurmstepd's but the pipe; a task gone mid-write is no signal. */
	if (tell > 3 && syscall(SYS_close_range, 3, tell - 1, 0) < 0)
		_exit(1);
	syscall(SYS_close_range, tell + 1, ~0U, 0);
	signal(SIGPIPE, SIG_IGN);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (setresuid(0, 0, 0) < 0 || setresgid(0, 0, 0) < 0) {
		snprintf(err, sizeof(err), "cannot take root back: %s", strerror(errno));
		goto fail;
	}
	int hostns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	if (hostns < 0) {
		snprintf(err, sizeof(err), "cannot open the host's network namespace: %s", strerror(errno));
		goto fail;
	}
	for (int t = 0; t < hpvc_slots; t++) {
		const struct hpvc_join *j = &hpvc_joins[t];
		int seen = 0;
		for (int u = 0; u < t; u++)
			seen |= hpvc_joins[u].pid == j->pid;
		if (j->vm || !(j->nsflags & CLONE_NEWNET) || seen)
			continue;
		/* The node's process, pinned by a pidfd once its start time matches. */
		unsigned long long start = 0;
		int pidfd = (int)syscall(SYS_pidfd_open, j->pid, 0);
		if (pidfd < 0 || hpvc_proc_start(j->pid, &start) < 0 || start != j->start) {
			snprintf(err, sizeof(err), "node %s is not running (its process changed)", j->node);
			goto fail;
		}
		int l = listen_in(pidfd, hostns, port, err, sizeof(err), j->node);
		close(pidfd);
		if (l < 0)
			goto fail;
		listeners[nl++] = l;
	}
	close(hostns);
	/* From here on nothing needs root: connecting to the host's loopback. */
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0) {
		snprintf(err, sizeof(err), "cannot take the job user's ids: %s", strerror(errno));
		goto fail;
	}
	/* Set after the change of ids, which clears it. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != stepd)
		_exit(1);
	prctl(PR_SET_NAME, "hpvc-pmixfwd", 0, 0, 0);
	say(tell, "ok");
	close(tell);
	serve(listeners, nl, port);
fail:
	say(tell, err);
	_exit(1);
}

int hpvc_pmix_forward(spank_t sp)
{
	static int started; /* this slurmstepd's step: once, at its first task */
	char mpi[64] = "";
	if (started || spank_getenv(sp, "SLURM_MPI_TYPE", mpi, sizeof(mpi)) != ESPANK_SUCCESS ||
	    strncmp(mpi, "pmix", 4) != 0)
		return 0;
	started = 1;
	int nodes = 0;
	for (int t = 0; t < hpvc_slots; t++)
		nodes += !hpvc_joins[t].vm && (hpvc_joins[t].nsflags & CLONE_NEWNET);
	if (nodes == 0)
		return 0;
	int port = server_port();
	if (port == 0) {
		slurm_error("hpvc: --mpi=%s: the step's PMIx server does not listen on the host's 127.0.0.1 over TCP (v4), the only place hpvc forwards into the nodes from: run the step with Slurm's default PMIx settings (mpi.conf, PMIX_MCA_ptl_*)",
			    mpi);
		return -1;
	}
	uid_t uid = 0;
	gid_t gid = 0;
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
		slurm_error("hpvc: cannot read the job's user and group ids");
		return -1;
	}
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0) {
		slurm_error("hpvc: PMIx forwarder: pipe: %s", strerror(errno));
		return -1;
	}
	pid_t stepd = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		slurm_error("hpvc: PMIx forwarder: fork: %s", strerror(errno));
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		close(p[0]);
		forwarder(p[1], stepd, port, uid, gid);
	}
	close(p[1]);
	char msg[512];
	size_t got = 0;
	for (;;) {
		ssize_t n = read(p[0], msg + got, sizeof(msg) - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (got += (size_t)n) >= sizeof(msg) - 1)
			break;
	}
	close(p[0]);
	msg[got] = '\0';
	if (strcmp(msg, "ok") == 0)
		return 0;
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	slurm_error("hpvc: --mpi=%s: cannot reach the step's PMIx server from the nodes: %s", mpi,
		    msg[0] ? msg : "the forwarder ended");
	return -1;
}
