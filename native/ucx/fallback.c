/* The ivshmem transport's way off the region: a guest that leaves the host (a live
 * migration to another host, issues 27 and 29) takes its ranks' endpoints with it, and
 * UCX 1.13 cannot move a live endpoint to another transport. So the endpoint stays, and
 * what it carries changes: from the region's FIFO to a TCP connection between the two
 * guests' cluster addresses. Active messages only: the transport offers no put, get or
 * atomics (mm_ivshmem.c's iface_query), so there is nothing else to carry.
 *
 * The departure (docs/vms.md, "A guest that leaves the host"):
 * 1. hpvc, on the host, appends the leaving guest's address to the region header's
 *    departures and bumps its epoch (region.h; hpvc.host.region_departure).
 * 2. Every send and progress call of every process here runs between fb_enter and
 *    fb_leave: the process's member entry counts it busy, then the epoch is read. A
 *    changed epoch switches every endpoint whose own or peer address has departed:
 *    take the endpoint's pending requests from mm's queue (they waited for FIFO room
 *    that may never come) and from then on frame each message onto one TCP connection
 *    the pair shares in both directions (below, "One connection a pair").
 * 3. hpvc moves the guest only when every member has seen the epoch or is not busy:
 *    a process that was not busy when the epoch changed reads the new one before its
 *    next write to any FIFO (the count and the epoch are a store-then-load pair on
 *    both sides, with a full barrier between), so after that no FIFO of the leaving
 *    guest is written, and the leaving guest writes no one's.
 * 4. Receiving: a peer sends its first frame only after its last message into our
 *    FIFO. On the first frame bytes of a connection this process reads its FIFO up to
 *    the head it sees then, before it hands on anything from the socket: per pair,
 *    messages stay in the order they were sent.
 *
 * One connection a pair: with a connection for each direction, no frame carries the
 * ACK of the other direction's, so every message costs a segment of its own and a bare
 * ACK (4 segments a round trip, 2 on one connection; measured on loopback with
 * /proc/net/snmp's OutSegs, docs/benchmarks.md). So of the two endpoints of a pair
 * (this iface to the peer's, the peer's to this one) the one whose iface's FIFO id is
 * lower connects; the other waits up to ADOPT_WAIT_NS for that connection (its hello
 * names both ifaces) and sends on it too, else connects itself. An endpoint that
 * switches later takes a connection the peer already made to it. Whichever way, a
 * direction's frames go on one connection only, and each side reads every connection
 * it has, its own too; if both sides connected at once, each sends on its own and
 * reads the other's (correct, only the ACKs are bare again).
 * The moved guest keeps a region device (a copy, its own: hpvc.backends.qemu.across),
 * so nothing it maps goes away under it; its copy lists itself as departed, so it
 * never reaches anyone through the copy.
 *
 * Long because the switch, the sends, flushes and pending queue, and the receiving side
 * share one lock, one endpoint list, the connections both sides use and one set of
 * ordering rules (above); apart, each half would have to reach into the other's state.
 *
 * Sockets are plain blocking-connect, non-blocking-I/O TCP: UCX's own tcp transport
 * cannot be borrowed for an endpoint that already exists (its eps are its own
 * objects), and libevent-style loops would fight UCX's progress model.
 */
#define _GNU_SOURCE
#include "fallback.h"

#include <uct/base/uct_iface.h>
#include <uct/base/uct_iov.inl>
#include <uct/sm/mm/base/mm_ep.h>
#include <uct/sm/mm/base/mm_iface.h>
#include <ucs/debug/log.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HELLO_MAGIC 0x46565048u /* "HPVF" */
#define DRAIN_GIVE_UP_NS 10000000000ull
/* Progress calls between looks at the listening socket, once a departure has been
 * seen (before, no peer can have switched: nothing to accept, and a system call in
 * the polling loop would cost the region's latency). */
#define ACCEPT_EVERY 64u
/* How long an endpoint whose peer connects waits for that connection before it makes
 * one itself (the peer has no endpoint back, or is busy outside UCX). */
#define ADOPT_WAIT_NS 500000000ull

/* The region's id proves the connector can map the region (or is in the job that
 * was given its address): anyone else in the guest could reach the listening port,
 * and must not put messages into the job's ranks. */
struct hello {
	uint32_t magic;
	uint32_t pad;
	uint64_t fifo; /* the receiving iface's FIFO segment id */
	uint64_t from; /* the connecting iface's: the pair it is for */
	uint8_t id[REGION_ID_LEN];
};

struct frame {
	uint32_t length; /* payload bytes */
	uint8_t id;	 /* active message id */
	uint8_t pad[3];
};

struct buf {
	char *data;
	size_t len, cap;
};

/* One of this process's ivshmem endpoints. */
struct fb_ep {
	struct fb_ep *next;
	uct_ep_h ep;
	uct_mm_iface_t *iface;
	fb_addr_t peer;
	uint64_t peer_fifo;
	int tcp; /* switched: everything goes over `fd` (-1: none yet, or the peer could not
		  * be reached) */
	int fd;
	struct fb_conn *conn; /* the connection `fd` is */
	int way;	      /* 0: no connection yet, 1: it opened `conn`, 2: the peer did */
	uint64_t wait_until;  /* waiting for the peer's connection until then (0: not) */
	struct buf out; /* framed bytes the socket has not taken yet */
	ucs_queue_head_t pending; /* in order: mm's, taken at the switch, then ours */
	int dispatching;	  /* our progress is handing the pending requests on */
	uint64_t sent, sent_bytes; /* messages and payload bytes over TCP */
};

/* A connection of a pair: one a peer opened to us, or one of our endpoints opened. */
struct fb_conn {
	struct fb_conn *next;
	int fd;
	uct_mm_iface_t *iface; /* ours, known from the hello when the peer opened it */
	uint64_t from;	       /* the peer iface's FIFO id */
	struct fb_ep *ep;      /* the endpoint that sends on it (NULL: none) */
	int outbound;	       /* opened by `ep` */
	int eof;	       /* the peer sends no more; kept while `ep` sends */
	int shut;	       /* our direction ended (its endpoint went) */
	int drained;
	struct buf in;
	uint64_t got, got_bytes; /* messages and payload bytes handed on */
};

static struct {
	pthread_mutex_t lock; /* the lists, the epoch switch */
	struct region *region;
	int member;
	uint32_t ip;
	uint16_t port;
	int listen_fd;
	uint32_t seen; /* the departure epoch acted on */
	int any_tcp;
	unsigned ticks;
	unsigned list_gen; /* bumped when an endpoint comes or goes */
	unsigned conns_gen; /* bumped when a connection comes or goes */
	pid_t pid;	   /* the process that joined (a forked child must not leave) */
	struct fb_ep *eps;
	struct fb_conn *conns;
	uct_mm_iface_t *ifaces[16]; /* open ones: a hello names one by its FIFO */
	uct_iface_ops_t mm; /* mm's own operations, wrapped below */
	int have_mm;
} g = {.lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP, /* AM handlers create eps */
      .member = -1, .listen_fd = -1};

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int buf_add(struct buf *b, const void *data, size_t len)
{
	if (b->len + len > b->cap) {
		size_t cap = b->cap ? b->cap : 65536;
		while (cap < b->len + len) cap *= 2;
		char *p = realloc(b->data, cap);
		if (p == NULL) return -1;
		b->data = p;
		b->cap = cap;
	}
	memcpy(b->data + b->len, data, len);
	b->len += len;
	return 0;
}

static void buf_drop(struct buf *b, size_t n)
{
	memmove(b->data, b->data + n, b->len - n);
	b->len -= n;
}

/* --- this process's address, socket and member entry ------------------------------------ */

/* UCX_IVSHMEM_ADDR, else the first up, non-loopback IPv4 address (a guest's cluster
 * address: hpvc's guests have one network interface). */
static uint32_t own_address(void)
{
	const char *env = getenv("UCX_IVSHMEM_ADDR");
	struct in_addr a;
	if (env && *env) return inet_pton(AF_INET, env, &a) == 1 ? a.s_addr : 0;
	struct ifaddrs *list, *i;
	uint32_t ip = 0;
	if (getifaddrs(&list) != 0) return 0;
	for (i = list; i && !ip; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
		    !(i->ifa_flags & IFF_LOOPBACK))
			ip = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
	freeifaddrs(list);
	return ip;
}

/* No Nagle: a frame must not wait for the ACK of the one before (where both sides
 * connected at once each direction has its connection, and no reply carries it); UCX's
 * own tcp sets TCP_NODELAY too. */
static void no_delay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int nonblocking(int fd)
{
	return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int fb_start(struct region *r)
{
	g.region = r;
	g.ip = own_address();
	if (g.ip) {
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = g.ip};
		socklen_t len = sizeof sa;
		g.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (g.listen_fd < 0 || bind(g.listen_fd, (void *)&sa, sizeof sa) != 0 ||
		    listen(g.listen_fd, 64) != 0 || getsockname(g.listen_fd, (void *)&sa, &len) != 0 ||
		    nonblocking(g.listen_fd) != 0) {
			ucs_warn("ivshmem: no fallback socket on %s: %m (a departure will fail "
				 "this process's endpoints)", inet_ntoa(sa.sin_addr));
			if (g.listen_fd >= 0) close(g.listen_fd);
			g.listen_fd = -1;
			g.ip = 0;
		}
		g.port = sa.sin_port;
	}
	g.pid = getpid();
	g.member = region_member_join(r, g.ip);
	if (g.member < 0) {
		ucs_debug("ivshmem: the region's member table is full, not offered");
		fb_stop();
		return -1;
	}
	g.seen = r->hdr->member[g.member].seen;
	return 0;
}

void fb_stop(void)
{
	if (g.pid != getpid()) return; /* a forked child: the entry is its parent's */
	if (g.member >= 0) region_member_leave(g.region, g.member);
	g.member = -1;
	if (g.listen_fd >= 0) close(g.listen_fd);
	g.listen_fd = -1;
}

void fb_addr_pack(void *buffer)
{
	fb_addr_t a = {.ip = g.ip, .port = g.port, .member = (uint16_t)g.member};
	memcpy(buffer, &a, sizeof a);
}

int fb_reachable(const fb_addr_t *peer)
{
	return !region_departed(g.region, g.ip) && !region_departed(g.region, peer->ip);
}

/* --- the switch ------------------------------------------------------------------------- */

static void take_pending(uct_pending_req_t *req, void *arg)
{
	struct fb_ep *e = arg;
	uct_pending_req_queue_push(&e->pending, req);
}

/* --- the connections (under g.lock) ----------------------------------------------------- */

static uint64_t own_fifo(const uct_mm_iface_t *iface)
{
	const uct_mm_seg_t *seg = iface->recv_fifo_mem.memh;
	return seg ? seg->seg_id : 0;
}

static struct fb_conn *conn_new(int fd)
{
	struct fb_conn *c = calloc(1, sizeof *c);
	if (c == NULL) return NULL;
	c->fd = fd;
	c->next = g.conns;
	g.conns = c;
	g.conns_gen++;
	g.any_tcp = 1;
	return c;
}

static void conn_close(struct fb_conn *c)
{
	for (struct fb_conn **p = &g.conns; *p; p = &(*p)->next) {
		if (*p != c) continue;
		*p = c->next;
		break;
	}
	g.conns_gen++;
	if (c->ep) { /* its endpoint's sends fail from now on */
		c->ep->conn = NULL;
		c->ep->fd = -1;
	}
	if (c->iface && (c->got || !c->outbound))
		ucs_info("ivshmem: received %" PRIu64 " messages (%" PRIu64 " bytes) over TCP",
			 c->got, c->got_bytes);
	close(c->fd);
	free(c->in.data);
	free(c);
}

static void attach(struct fb_ep *e, struct fb_conn *c)
{
	e->conn = c;
	e->way = c->outbound ? 1 : 2;
	e->fd = c->fd;
	e->wait_until = 0;
	c->ep = e;
}

/* A connection the peer of `e` made for this pair, that no endpoint sends on yet. */
static struct fb_conn *peer_conn(const struct fb_ep *e)
{
	for (struct fb_conn *c = g.conns; c; c = c->next)
		if (!c->ep && !c->outbound && !c->eof && !c->shut && c->iface == e->iface &&
		    c->from == e->peer_fifo)
			return c;
	return NULL;
}

static void connect_peer(struct fb_ep *e)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = e->peer.ip,
				 .sin_port = e->peer.port};
	struct timeval tv = {.tv_sec = 10};
	struct hello h = {.magic = HELLO_MAGIC, .fifo = e->peer_fifo, .from = own_fifo(e->iface)};
	memcpy(h.id, g.region->hdr->id, sizeof h.id);
	e->wait_until = 0;
	int fd = e->peer.ip ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
	if (fd >= 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		no_delay(fd);
	}
	struct fb_conn *c = NULL;
	if (fd < 0 || connect(fd, (void *)&sa, sizeof sa) != 0 ||
	    send(fd, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h || nonblocking(fd) != 0 ||
	    (c = conn_new(fd)) == NULL) {
		ucs_error("ivshmem: cannot reach %s:%u off the region: %m", inet_ntoa(sa.sin_addr),
			  ntohs(sa.sin_port));
		if (fd >= 0) close(fd);
		return;
	}
	c->iface = e->iface;
	c->from = e->peer_fifo;
	c->outbound = 1;
	attach(e, c);
}

/* Take `e` off the region: onto the peer's connection for this pair, or a new one of
 * ours, or wait for the peer's (the lower FIFO id connects; see the top). */
static void leave_region(struct fb_ep *e)
{
	struct in_addr a = {.s_addr = e->peer.ip};
	struct fb_conn *c = peer_conn(e);
	e->tcp = 1;
	g.any_tcp = 1;
	ucs_info("ivshmem: endpoint to %s leaves the region for TCP", inet_ntoa(a));
	if (c)
		attach(e, c);
	else if (own_fifo(e->iface) <= e->peer_fifo)
		connect_peer(e);
	else
		e->wait_until = mono_ns() + ADOPT_WAIT_NS;
}

/* Under g.lock: act on departure epoch `epoch`. */
static void switch_departed(uint32_t epoch)
{
	int self_gone = region_departed(g.region, g.ip);
	for (struct fb_ep *e = g.eps; e; e = e->next) {
		if (e->tcp || !(self_gone || region_departed(g.region, e->peer.ip))) continue;
		leave_region(e);
		g.mm.ep_pending_purge(e->ep, take_pending, e);
	}
	g.seen = epoch;
	__atomic_store_n(&g.region->hdr->member[g.member].seen, epoch, __ATOMIC_RELEASE);
}

static __thread unsigned depth; /* this thread's nesting of fb_enter */

/* Count this call busy, then read the epoch. Endpoints switch only in an outermost
 * call: a nested one (a send that mm's own pending dispatch makes, inside progress)
 * must not take mm's pending queue from under that dispatch; it keeps writing the
 * region, and the member stays busy with the old epoch until the outer call is done,
 * so hpvc keeps waiting for it. */
static inline void fb_enter(void)
{
	struct region_member *me = &g.region->hdr->member[g.member];
	__atomic_add_fetch(&me->busy, 1, __ATOMIC_SEQ_CST); /* a full barrier on x86 */
	uint32_t epoch = __atomic_load_n(&g.region->hdr->epoch, __ATOMIC_ACQUIRE);
	if (ucs_unlikely(epoch != g.seen) && depth == 0) {
		pthread_mutex_lock(&g.lock);
		if (epoch != g.seen) switch_departed(epoch);
		pthread_mutex_unlock(&g.lock);
	}
	depth++;
}

static inline void fb_leave(void)
{
	depth--;
	__atomic_sub_fetch(&g.region->hdr->member[g.member].busy, 1, __ATOMIC_RELEASE);
}

/* Sends wait behind the pending requests (UCX keeps an endpoint's order that way),
 * but for the one being handed on; and all of them while the endpoint waits for its
 * peer's connection. */
static inline int behind(const struct fb_ep *e)
{
	return e->wait_until || (!e->dispatching && !ucs_queue_is_empty(&e->pending));
}

/* The endpoint's record, when it has left the region (NULL: it is on the region). */
static inline struct fb_ep *off_region(uct_ep_h ep)
{
	if (ucs_likely(!g.any_tcp)) return NULL;
	for (struct fb_ep *e = g.eps; e; e = e->next)
		if (e->ep == ep) return e->tcp ? e : NULL;
	return NULL;
}

/* --- sending over the socket ------------------------------------------------------------ */

static ucs_status_t flush_out(struct fb_ep *e)
{
	while (e->out.len) {
		ssize_t n = send(e->fd, e->out.data, e->out.len, MSG_NOSIGNAL);
		if (n > 0) buf_drop(&e->out, (size_t)n);
		else if (n < 0 && (errno == EAGAIN || errno == EINTR)) return UCS_ERR_NO_RESOURCE;
		else {
			ucs_error("ivshmem: the fallback connection failed: %m");
			return UCS_ERR_CONNECTION_RESET;
		}
	}
	return UCS_OK;
}

static ucs_status_t send_frame(struct fb_ep *e, uint8_t id, const void *a, size_t alen,
			       const void *b, size_t blen)
{
	struct frame f = {.length = (uint32_t)(alen + blen), .id = id};
	if (e->fd < 0) return UCS_ERR_UNREACHABLE;
	e->sent++;
	e->sent_bytes += f.length;
	if (e->out.len == 0) { /* straight onto the socket, the rest buffered */
		struct iovec iov[3] = {{&f, sizeof f}, {(void *)a, alen}, {(void *)b, blen}};
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 3};
		ssize_t n = sendmsg(e->fd, &msg, MSG_NOSIGNAL);
		if (n < 0 && errno != EAGAIN && errno != EINTR) return flush_out(e);
		size_t done = n > 0 ? (size_t)n : 0;
		for (int i = 0; i < 3; i++) {
			size_t skip = done < iov[i].iov_len ? done : iov[i].iov_len;
			done -= skip;
			if (buf_add(&e->out, (char *)iov[i].iov_base + skip, iov[i].iov_len - skip))
				return UCS_ERR_NO_MEMORY;
		}
		return UCS_OK;
	}
	if (buf_add(&e->out, &f, sizeof f) || buf_add(&e->out, a, alen) || buf_add(&e->out, b, blen))
		return UCS_ERR_NO_MEMORY;
	ucs_status_t status = flush_out(e);
	return status == UCS_ERR_NO_RESOURCE ? UCS_OK : status;
}

static ucs_status_t fb_am_short(uct_ep_h ep, uint8_t id, uint64_t header, const void *payload,
				unsigned length)
{
	fb_enter();
	struct fb_ep *e = off_region(ep);
	ucs_status_t status = !e	      ? g.mm.ep_am_short(ep, id, header, payload, length)
			      : behind(e) ? UCS_ERR_NO_RESOURCE
					  : send_frame(e, id, &header, sizeof header, payload, length);
	fb_leave();
	return status;
}

static ucs_status_t fb_am_short_iov(uct_ep_h ep, uint8_t id, const uct_iov_t *iov, size_t iovcnt)
{
	fb_enter();
	struct fb_ep *e = off_region(ep);
	ucs_status_t status;
	if (e && behind(e)) {
		status = UCS_ERR_NO_RESOURCE;
	} else if (e) {
		char data[e->iface->config.fifo_elem_size]; /* mm's limit on a short message */
		ucs_iov_iter_t it;
		ucs_iov_iter_init(&it);
		size_t n = uct_iov_to_buffer(iov, iovcnt, &it, data, sizeof data);
		status = send_frame(e, id, data, n, NULL, 0);
	} else {
		status = g.mm.ep_am_short_iov(ep, id, iov, iovcnt);
	}
	fb_leave();
	return status;
}

static ssize_t fb_am_bcopy(uct_ep_h ep, uint8_t id, uct_pack_callback_t pack, void *arg,
			   unsigned flags)
{
	fb_enter();
	struct fb_ep *e = off_region(ep);
	ssize_t n;
	if (e && behind(e)) {
		n = UCS_ERR_NO_RESOURCE;
	} else if (e) {
		void *data = malloc(e->iface->config.seg_size);
		n = data ? (ssize_t)pack(data, arg) : UCS_ERR_NO_MEMORY;
		if (n >= 0) {
			ucs_status_t status = send_frame(e, id, data, (size_t)n, NULL, 0);
			n = status == UCS_OK ? n : status;
		}
		free(data);
	} else {
		n = g.mm.ep_am_bcopy(ep, id, pack, arg, flags);
	}
	fb_leave();
	return n;
}

static ucs_status_t fb_ep_flush(uct_ep_h ep, unsigned flags, uct_completion_t *comp)
{
	struct fb_ep *e = off_region(ep);
	if (e == NULL) return g.mm.ep_flush(ep, flags, comp);
	if (behind(e)) return UCS_ERR_NO_RESOURCE;
	return e->fd < 0 ? UCS_OK : flush_out(e);
}

static ucs_status_t fb_pending_add(uct_ep_h ep, uct_pending_req_t *req, unsigned flags)
{
	struct fb_ep *e = off_region(ep);
	if (e == NULL) return g.mm.ep_pending_add(ep, req, flags);
	if (e->out.len == 0 && !behind(e)) return UCS_ERR_BUSY; /* room now: try again */
	uct_pending_req_queue_push(&e->pending, req);
	return UCS_OK;
}

static void fb_pending_purge(uct_ep_h ep, uct_pending_purge_callback_t cb, void *arg)
{
	for (struct fb_ep *e = g.eps; e; e = e->next) {
		if (e->ep != ep) continue;
		uct_pending_req_priv_queue_t *priv;
		ucs_queue_for_each_extract(priv, &e->pending, queue_elem, 1) {
			cb(ucs_container_of(priv, uct_pending_req_t, priv), arg);
		}
	}
	g.mm.ep_pending_purge(ep, cb, arg);
}

static ucs_status_t fb_iface_flush(uct_iface_h iface, unsigned flags, uct_completion_t *comp)
{
	ucs_status_t status = UCS_OK;
	for (struct fb_ep *e = g.eps; e; e = e->next)
		if (e->tcp && e->fd >= 0 && &e->iface->super.super.super == iface && flush_out(e))
			status = UCS_ERR_NO_RESOURCE;
	return status == UCS_OK ? g.mm.iface_flush(iface, flags, comp) : status;
}

static ucs_status_t fb_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p)
{
	struct fb_ep *e = calloc(1, sizeof *e);
	if (e == NULL) return UCS_ERR_NO_MEMORY;
	ucs_status_t status = g.mm.ep_create(params, ep_p);
	if (status != UCS_OK) {
		free(e);
		return status;
	}
	const uct_mm_iface_addr_t *addr = (const void *)params->iface_addr;
	e->ep = *ep_p;
	e->iface = ucs_derived_of(params->iface, uct_mm_iface_t);
	e->peer_fifo = addr->fifo_seg_id;
	memcpy(&e->peer, addr + 1, sizeof e->peer);
	e->fd = -1;
	ucs_queue_head_init(&e->pending);
	pthread_mutex_lock(&g.lock);
	e->next = g.eps;
	g.eps = e;
	g.list_gen++;
	/* An endpoint made after its peer (or this process) left starts off the region. */
	if (region_departed(g.region, g.ip) || region_departed(g.region, e->peer.ip))
		leave_region(e);
	pthread_mutex_unlock(&g.lock);
	return UCS_OK;
}

static void fb_ep_destroy(uct_ep_h ep)
{
	pthread_mutex_lock(&g.lock);
	for (struct fb_ep **p = &g.eps; *p; p = &(*p)->next) {
		struct fb_ep *e = *p;
		if (e->ep != ep) continue;
		*p = e->next;
		g.list_gen++;
		struct fb_conn *c = e->conn;
		if (c) { /* our direction ends; the peer's may go on until it ends too */
			flush_out(e);
			shutdown(c->fd, SHUT_WR);
			c->ep = NULL;
			c->shut = 1;
			if (c->eof) conn_close(c);
		}
		if (e->tcp) {
			struct in_addr a = {.s_addr = e->peer.ip};
			static const char *const ways[] = {"no", "its own", "the peer's"};
			ucs_info("ivshmem: endpoint to %s sent %" PRIu64 " messages (%" PRIu64
				 " bytes) over TCP, on %s connection", inet_ntoa(a), e->sent,
				 e->sent_bytes, ways[e->way]);
		}
		free(e->out.data);
		free(e);
		break;
	}
	pthread_mutex_unlock(&g.lock);
	g.mm.ep_destroy(ep);
}

/* --- receiving -------------------------------------------------------------------------- */

static void accept_new(void)
{
	for (;;) {
		int fd = accept4(g.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) return;
		no_delay(fd);
		if (conn_new(fd) == NULL) {
			close(fd);
			return;
		}
	}
}

/* An endpoint of ours that waits for the connection `c` the peer made for its pair. */
static void adopt(struct fb_conn *c)
{
	for (struct fb_ep *e = g.eps; e; e = e->next) {
		if (e->wait_until && !c->shut && e->iface == c->iface && e->peer_fifo == c->from) {
			attach(e, c);
			return;
		}
	}
}

/* Read our FIFO up to the head it has now (the peer's last message into it is there). */
static void drain(uct_mm_iface_t *iface)
{
	uint64_t head = __atomic_load_n(&iface->recv_fifo_ctl->head, __ATOMIC_ACQUIRE) &
			~UCT_MM_IFACE_FIFO_HEAD_EVENT_ARMED;
	uint64_t start = mono_ns();
	while ((int64_t)(head - iface->read_index) > 0) {
		g.mm.iface_progress(&iface->super.super.super);
		if (mono_ns() - start > DRAIN_GIVE_UP_NS) {
			ucs_warn("ivshmem: FIFO not drained in 10 s; going on over TCP");
			break;
		}
	}
}

static uct_mm_iface_t *iface_by_fifo(uint64_t fifo)
{
	for (size_t i = 0; i < ucs_static_array_size(g.ifaces); i++) {
		const uct_mm_seg_t *seg = g.ifaces[i] ? g.ifaces[i]->recv_fifo_mem.memh : NULL;
		if (seg && seg->seg_id == fifo) return g.ifaces[i];
	}
	return NULL;
}

/* Hand on the whole frames `c` holds; -1 when the connection is bad. */
static int deliver(struct fb_conn *c, uct_mm_iface_t *iface, unsigned *count)
{
	size_t at = 0;
	if (c->iface == NULL) {
		struct hello h;
		if (c->in.len < sizeof h) return 0;
		memcpy(&h, c->in.data, sizeof h);
		int ours = h.magic == HELLO_MAGIC && !memcmp(h.id, g.region->hdr->id, sizeof h.id);
		c->iface = ours ? iface_by_fifo(h.fifo) : NULL;
		if (c->iface == NULL) return -1;
		c->from = h.from;
		buf_drop(&c->in, sizeof h);
		adopt(c);
	}
	if (c->iface != iface) return 0; /* another iface's progress reads it */
	if (!c->drained) { /* the peer's first frame: it writes our FIFO no more */
		if (c->in.len == 0) return 0;
		drain(iface);
		c->drained = 1;
	}
	for (;;) {
		struct frame f;
		if (c->in.len - at < sizeof f) break;
		memcpy(&f, c->in.data + at, sizeof f);
		if (c->in.len - at - sizeof f < f.length) break;
		uct_iface_invoke_am(&iface->super.super, f.id, c->in.data + at + sizeof f, f.length, 0);
		at += sizeof f + f.length;
		c->got++;
		c->got_bytes += f.length;
		++*count;
	}
	buf_drop(&c->in, at);
	return 0;
}

static unsigned read_conns(uct_mm_iface_t *iface)
{
	unsigned count = 0, gen = g.conns_gen;
	for (struct fb_conn *c = g.conns, *next; c && gen == g.conns_gen; c = next) {
		next = c->next;
		if (c->eof || (c->iface && c->iface != iface)) continue;
		char chunk[65536];
		ssize_t n = recv(c->fd, chunk, sizeof chunk, 0);
		int bad = n == 0;
		if (n < 0) bad = errno != EAGAIN && errno != EINTR;
		if (n > 0 && buf_add(&c->in, chunk, (size_t)n)) bad = 1;
		if (!bad && deliver(c, iface, &count) != 0) bad = 1;
		if (gen != g.conns_gen) break; /* a handler made a connection: `next` may be stale */
		if (!bad) continue;
		if (c->ep && c->iface) /* the peer's direction ended; ours goes on */
			c->eof = 1;
		else /* closed (the peer's endpoint went) or not one of ours */
			conn_close(c);
		gen = g.conns_gen;
	}
	return count;
}

static unsigned fb_progress(uct_iface_h tl_iface)
{
	uct_mm_iface_t *iface = ucs_derived_of(tl_iface, uct_mm_iface_t);
	fb_enter();
	unsigned count = g.mm.iface_progress(tl_iface);
	if (ucs_unlikely(g.seen != 0) && g.listen_fd >= 0 && ++g.ticks % ACCEPT_EVERY == 0)
		accept_new();
	if (g.any_tcp) {
		pthread_mutex_lock(&g.lock);
		count += read_conns(iface);
		unsigned gen = g.list_gen;
		uint64_t now = 0;
		for (struct fb_ep *e = g.eps; e; e = gen == g.list_gen ? e->next : NULL) {
			if (!e->tcp || e->iface != iface) continue;
			if (e->wait_until && e->wait_until < (now ? now : (now = mono_ns())))
				connect_peer(e); /* the peer did not connect: we do */
			if (e->wait_until) continue;
			if (e->fd >= 0 && flush_out(e) != UCS_OK) continue;
			uct_pending_req_priv_queue_t *priv;
			e->dispatching = 1;
			uct_pending_queue_dispatch(priv, &e->pending, e->out.len == 0);
			if (gen == g.list_gen) e->dispatching = 0;
		} /* an endpoint that came or went meanwhile: the rest waits for the next call */
		pthread_mutex_unlock(&g.lock);
	}
	fb_leave();
	return count;
}

void fb_forget_iface(uct_iface_h tl_iface)
{
	uct_mm_iface_t *iface = ucs_derived_of(tl_iface, uct_mm_iface_t);
	pthread_mutex_lock(&g.lock);
	for (size_t i = 0; i < ucs_static_array_size(g.ifaces); i++)
		if (g.ifaces[i] == iface) g.ifaces[i] = NULL;
	for (struct fb_conn *c = g.conns, *next; c; c = next) {
		next = c->next;
		if (c->iface == iface) conn_close(c);
	}
	pthread_mutex_unlock(&g.lock);
}

void fb_install(uct_iface_h iface)
{
	uct_iface_ops_t *ops = &iface->ops;
	pthread_mutex_lock(&g.lock);
	for (size_t i = 0; i < ucs_static_array_size(g.ifaces); i++) {
		if (g.ifaces[i] != NULL) continue;
		g.ifaces[i] = ucs_derived_of(iface, uct_mm_iface_t);
		break;
	}
	pthread_mutex_unlock(&g.lock);
	if (!g.have_mm) {
		g.mm = *ops;
		g.have_mm = 1;
	}
	ops->ep_am_short = fb_am_short;
	ops->ep_am_short_iov = fb_am_short_iov;
	ops->ep_am_bcopy = fb_am_bcopy;
	ops->ep_flush = fb_ep_flush;
	ops->ep_pending_add = fb_pending_add;
	ops->ep_pending_purge = fb_pending_purge;
	ops->ep_create = fb_ep_create;
	ops->ep_destroy = fb_ep_destroy;
	ops->iface_flush = fb_iface_flush;
	ops->iface_progress = fb_progress;
}
