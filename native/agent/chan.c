/* Channels beside a command (agent.h): Slurm's PMIx and PMI-2 for a task in
 * a VM guest, carried over the connection the task relay already has to the
 * guest's agent (docs/slurm.md, "MPI between guests").
 *
 * Frames: client -> agent before 'g': 'p' (2 bytes, big-endian: the port of
 * the step's PMIx server on the host's 127.0.0.1) and 'P' (the task has a
 * PMI-2 stream, PMI_FD). Then 'C' agent -> client (4 bytes: channel N was
 * accepted), 'c' both ways (N, then bytes), 'q' both ways (N closed).
 *
 * Guest (the agent's handler for one command): 'p' makes a listener on the
 * guest's 127.0.0.1, a free port of its own (two tasks of a step may share a
 * guest), and the command's PMIX_SERVER_URI* name it instead of the host's
 * port; each client it accepts becomes a channel. 'P' gives the command one
 * end of a socketpair as PMI_FD: channel 0.
 *
 * Host (the task relay, as the job's user, in the host's network): a new
 * channel connects to 127.0.0.1:PORT from the relay's own environment, never
 * to an address the guest names, and its first bytes must be a PMIx client's
 * connection request for this task's namespace and rank (pmixhs.c), whose
 * claimed uid and gid become the relay's: over TCP PMIx's native security
 * takes the client's word for them (the guest's task is root there), and the
 * relay is the real peer on the host. Channel 0 is the task's PMI_FD. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

#define CHUNK 16384

struct chan {
	int fd; /* -1: free */
	uint32_t id;
	int checking; /* host: the PMIx request is still being read (pmixhs.c) */
	unsigned char *head;
	uint32_t head_len;
};

static struct {
	int host;     /* 1 relay, 0 guest */
	int listener; /* guest: 127.0.0.1 listener for PMIx clients */
	unsigned port; /* the host's PMIx server port */
	int pmi;      /* host: the task's PMI_FD; guest: the command's end */
	int want_pmi;
	uint32_t next;
	struct chan ch[HPVC_CHAN_MAX];
	char nspace[256];
	uint32_t rank;
} S = { .listener = -1, .pmi = -1, .next = 1 };

static void init_slots(void)
{
	static int done;
	if (!done)
		for (int i = 0; i < HPVC_CHAN_MAX; i++)
			S.ch[i].fd = -1;
	done = 1;
}

static struct chan *find(uint32_t id)
{
	for (int i = 0; i < HPVC_CHAN_MAX; i++)
		if (S.ch[i].fd >= 0 && S.ch[i].id == id)
			return &S.ch[i];
	return NULL;
}

static struct chan *add(int fd, uint32_t id)
{
	init_slots();
	for (int i = 0; i < HPVC_CHAN_MAX; i++)
		if (S.ch[i].fd < 0) {
			S.ch[i] = (struct chan){ .fd = fd, .id = id };
			return &S.ch[i];
		}
	return NULL;
}

static void drop(struct chan *c)
{
	close(c->fd);
	free(c->head);
	*c = (struct chan){ .fd = -1 };
}

static int send_id(int sock, char type, uint32_t id, const void *data, uint32_t len)
{
	unsigned char buf[4 + CHUNK];
	uint32_t be = htonl(id);
	memcpy(buf, &be, 4);
	if (len)
		memcpy(buf + 4, data, len);
	return hpvc_frame_send(sock, type, buf, 4 + len);
}

/* ---- host (the task relay) ---------------------------------------------- */

/* The port of "...;tcp4://127.0.0.1:PORT" (0: not that form). */
static unsigned uri_port(const char *uri)
{
	const char *at = strstr(uri, "://127.0.0.1:");
	if (at == NULL)
		return 0;
	char *end = NULL;
	unsigned long p = strtoul(at + 13, &end, 10);
	return end != at + 13 && *end == '\0' && p > 0 && p < 65536 ? (unsigned)p : 0;
}

static const char *value(char *const env[], const char *name)
{
	size_t n = strlen(name);
	for (int i = 0; env && env[i]; i++)
		if (strncmp(env[i], name, n) == 0 && env[i][n] == '=')
			return env[i] + n + 1;
	return NULL;
}

int hpvc_chan_host_setup(char *const env[], const char **why)
{
	init_slots();
	S.host = 1;
	static const char *const uris[] = { "PMIX_SERVER_URI41", "PMIX_SERVER_URI4",
					     "PMIX_SERVER_URI3", "PMIX_SERVER_URI21",
					     "PMIX_SERVER_URI2" };
	for (size_t i = 0; i < sizeof(uris) / sizeof(uris[0]) && !S.port; i++) {
		const char *u = value(env, uris[i]);
		if (u && !(S.port = uri_port(u))) {
			*why = "the step's PMIx server is not on 127.0.0.1 (PMIX_SERVER_URI*)";
			return -1;
		}
	}
	if (S.port) {
		const char *ns = value(env, "PMIX_NAMESPACE"), *rank = value(env, "PMIX_RANK");
		if (ns == NULL || rank == NULL || strlen(ns) >= sizeof(S.nspace)) {
			*why = "PMIX_NAMESPACE or PMIX_RANK missing beside PMIX_SERVER_URI*";
			return -1;
		}
		snprintf(S.nspace, sizeof(S.nspace), "%s", ns);
		S.rank = (uint32_t)strtoul(rank, NULL, 10);
	}
	const char *fd = value(env, "PMI_FD");
	if (fd) {
		struct stat st;
		int n = atoi(fd);
		if (n <= 2 || fstat(n, &st) < 0 || !S_ISSOCK(st.st_mode)) {
			*why = "PMI_FD is not an open socket";
			return -1;
		}
		S.pmi = n;
		add(n, 0);
	}
	return 0;
}

int hpvc_chan_send_asks(int sock)
{
	unsigned char port[2] = { (unsigned char)(S.port >> 8), (unsigned char)S.port };
	if (S.port && hpvc_frame_send(sock, 'p', port, 2) < 0)
		return -1;
	return S.pmi >= 0 ? hpvc_frame_send(sock, 'P', NULL, 0) : 0;
}

/* 'C' from the agent: a guest client connected; the relay connects to the
 * step's server for it (as itself: the user, in the host's network). */
static int host_open(int sock, uint32_t id)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)S.port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = S.port && id != 0 && !find(id) ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
	struct chan *c = NULL;
	if (fd >= 0 && connect(fd, (struct sockaddr *)&to, sizeof(to)) == 0)
		c = add(fd, id);
	if (c == NULL) {
		if (fd >= 0)
			close(fd);
		return send_id(sock, 'q', id, NULL, 0);
	}
	c->checking = 1;
	return 0;
}

/* Bytes from the guest for a host channel still checking its PMIx request:
 * collect them, and once the request is whole, pass it on (made the relay's)
 * or refuse the channel. */
static int host_check(int sock, struct chan *c, const unsigned char *p, uint32_t n)
{
	unsigned char *more = realloc(c->head, c->head_len + n);
	if (more == NULL || c->head_len + n > HPVC_PMIX_HEAD_MAX)
		goto refuse;
	c->head = more;
	memcpy(c->head + c->head_len, p, n);
	c->head_len += n;
	const char *why = "";
	int rc = hpvc_pmix_request_check(c->head, c->head_len, S.nspace, S.rank, getuid(), getgid(),
					 &why);
	if (rc == 0)
		return 0; /* not whole yet */
	if (rc > 0 && hpvc_write_all(c->fd, c->head, c->head_len) == 0) {
		c->checking = 0;
		return 0;
	}
	if (rc < 0)
		dprintf(2, "hpvc: PMIx channel from the guest refused: %s\n", why);
refuse:
	send_id(sock, 'q', c->id, NULL, 0);
	drop(c);
	return 0;
}

/* ---- guest (the agent's handler) ---------------------------------------- */

int hpvc_chan_ask(char type, const unsigned char *p, uint32_t len)
{
	init_slots();
	if (type == 'p' && len == 2)
		S.port = ((unsigned)p[0] << 8) | p[1];
	else if (type == 'P' && len == 0)
		S.want_pmi = 1;
	else
		return -1;
	return 0;
}

/* NAME=...//127.0.0.1:OLD... with OLD the host's port made NEW (a new string). */
static char *with_port(const char *kv, unsigned port)
{
	char from[32];
	snprintf(from, sizeof(from), "//127.0.0.1:%u", S.port);
	const char *at = strstr(kv, from);
	size_t tail = at ? strlen(at + strlen(from)) : 0;
	if (at == NULL || (tail && at[strlen(from)] >= '0' && at[strlen(from)] <= '9'))
		return NULL;
	char *out = malloc(strlen(kv) + 16);
	if (out)
		sprintf(out, "%.*s//127.0.0.1:%u%s", (int)(at - kv), kv, port, at + strlen(from));
	return out;
}

static int set_env(char **env, int *envc, int cap, char *kv)
{
	size_t k = strcspn(kv, "=");
	for (int i = 0; i < *envc; i++)
		if (strncmp(env[i], kv, k + 1) == 0) {
			env[i] = kv;
			return 0;
		}
	if (*envc >= cap)
		return -1;
	env[(*envc)++] = kv;
	return 0;
}

int hpvc_chan_guest_prepare(char **env, int *envc, int cap)
{
	init_slots();
	if (S.port) {
		struct sockaddr_in me = { .sin_family = AF_INET,
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t len = sizeof(me);
		S.listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (S.listener < 0 || bind(S.listener, (struct sockaddr *)&me, sizeof(me)) < 0 ||
		    listen(S.listener, 16) < 0 ||
		    getsockname(S.listener, (struct sockaddr *)&me, &len) < 0)
			return -1;
		for (int i = 0; i < *envc; i++) {
			char *kv = strncmp(env[i], "PMIX_SERVER_URI", 15) == 0
					   ? with_port(env[i], ntohs(me.sin_port))
					   : NULL;
			if (kv)
				env[i] = kv;
		}
	}
	if (S.want_pmi) {
		int sv[2];
		static char fdvar[32];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			return -1;
		/* Ours closes on exec; the command's (sv[1]) stays its PMI_FD. */
		if (fcntl(sv[1], F_SETFD, 0) < 0 || !add(sv[0], 0))
			return -1;
		S.pmi = sv[1];
		snprintf(fdvar, sizeof(fdvar), "PMI_FD=%d", sv[1]);
		if (set_env(env, envc, cap, fdvar) < 0)
			return -1;
	}
	return 0;
}

void hpvc_chan_guest_started(void)
{
	if (!S.host && S.pmi >= 0) {
		close(S.pmi);
		S.pmi = -1;
	}
}

/* ---- both ---------------------------------------------------------------- */

int hpvc_chan_poll(struct pollfd *fds)
{
	int n = 0;
	init_slots();
	if (S.listener >= 0)
		fds[n++] = (struct pollfd){ S.listener, POLLIN, 0 };
	for (int i = 0; i < HPVC_CHAN_MAX; i++)
		if (S.ch[i].fd >= 0)
			fds[n++] = (struct pollfd){ S.ch[i].fd, POLLIN, 0 };
	return n;
}

int hpvc_chan_ready(int sock, const struct pollfd *fds, int n)
{
	static unsigned char buf[CHUNK];
	for (int i = 0; i < n; i++) {
		if (!fds[i].revents)
			continue;
		if (fds[i].fd == S.listener) {
			int c = accept4(S.listener, NULL, NULL, SOCK_CLOEXEC);
			uint32_t id = S.next++;
			if (c >= 0 && !add(c, id))
				close(c);
			else if (c >= 0 && send_id(sock, 'C', id, NULL, 0) < 0)
				return -1;
			continue;
		}
		struct chan *c = NULL;
		for (int k = 0; k < HPVC_CHAN_MAX && !c; k++)
			if (S.ch[k].fd == fds[i].fd)
				c = &S.ch[k];
		if (c == NULL)
			continue;
		ssize_t got = read(c->fd, buf, sizeof(buf));
		if (got < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		int rc = got > 0 ? send_id(sock, 'c', c->id, buf, (uint32_t)got)
				 : send_id(sock, 'q', c->id, NULL, 0);
		if (got <= 0)
			drop(c);
		if (rc < 0)
			return -1;
	}
	return 0;
}

int hpvc_chan_frame(int sock, char type, const unsigned char *p, uint32_t len)
{
	uint32_t be;
	if (len < 4)
		return -1;
	memcpy(&be, p, 4);
	uint32_t id = ntohl(be);
	if (type == 'C')
		return S.host ? host_open(sock, id) : -1;
	struct chan *c = find(id);
	if (c == NULL)
		return 0; /* closed on this side already: its 'q' is on the way */
	if (type == 'q') {
		drop(c);
		return 0;
	}
	if (type != 'c')
		return -1;
	if (c->checking)
		return host_check(sock, c, p + 4, len - 4);
	if (hpvc_write_all(c->fd, p + 4, len - 4) < 0) {
		send_id(sock, 'q', id, NULL, 0);
		drop(c);
	}
	return 0;
}

int hpvc_chan_active(void)
{
	return S.port || S.pmi >= 0 || S.want_pmi;
}
