/* The shared region's allocator (layout and rules in region.h).
 *
 * Hand-written rather than a library's: the allocator's state must live inside the
 * shared region itself, be read by processes of different kernels (guests), and judge
 * dead owners by boot id and pid namespace; no allocator packaged in Debian keeps its
 * metadata in a caller-given area shared across kernels. Its lock is a spin lock on a
 * word of the region (futexes and robust mutexes do not work between guests' kernels);
 * a holder that died is found by the same rules as a dead segment owner.
 */
#define _GNU_SOURCE
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOCK_PATIENCE_NS 100000000ull /* 0.1 s, then ask whether the holder died */
#define LOCK_GIVE_UP_NS 10000000000ull /* 10 s */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int read_text(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, size - 1);
	if (fd >= 0) close(fd);
	if (n <= 0) return -1;
	buf[n] = '\0';
	return 0;
}

/* The kernel's boot id (a UUID: 32 hex digits and dashes) as 16 bytes: 0, or -1. */
static int boot_id(uint8_t out[16])
{
	char text[64];
	int n = 0;
	if (read_text("/proc/sys/kernel/random/boot_id", text, sizeof text) != 0) return -1;
	for (const char *p = text; *p && n < 32; p++) {
		int v = (*p >= '0' && *p <= '9')   ? *p - '0'
			: (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10
						   : -1;
		if (v < 0) continue;
		out[n / 2] = (uint8_t)(n % 2 ? out[n / 2] | v : v << 4);
		n++;
	}
	return n == 32 ? 0 : -1;
}

/* A process's start time (field 22 of /proc/PID/stat); 0 when it is gone or a zombie
 * (state Z or X, field 3: it maps nothing any more, and may never be reaped here). */
static uint64_t start_time(uint32_t pid)
{
	char path[64], text[1024];
	snprintf(path, sizeof path, "/proc/%u/stat", pid);
	if (read_text(path, text, sizeof text) != 0) return 0;
	const char *p = strrchr(text, ')'); /* the name may hold spaces and parentheses */
	if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X') return 0;
	for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

int region_identity(struct region *r)
{
	struct stat st;
	memset(&r->me, 0, sizeof r->me);
	if (boot_id(r->me.boot) != 0 || stat("/proc/self/ns/pid", &st) != 0) return -1;
	r->me.pidns = st.st_ino;
	r->me.pid = (uint32_t)getpid();
	r->me.start = start_time(r->me.pid);
	r->token = r->me.pid ? r->me.pid : 1;
	r->quarantine_ns = REGION_QUARANTINE_NS;
	return r->me.start ? 0 : -1;
}

/* Has `o` died? Only a process of the same kernel and pid namespace can tell; for any
 * other owner the answer is no (its own neighbours will reclaim what it held). */
static int owner_dead(const struct region *r, const struct region_owner *o)
{
	if (memcmp(o->boot, r->me.boot, sizeof o->boot) != 0 || o->pidns != r->me.pidns)
		return 0;
	if (o->pid == r->me.pid) return o->start != r->me.start;
	if (kill((pid_t)o->pid, 0) != 0 && errno == ESRCH) return 1;
	return start_time(o->pid) != o->start;
}

/* Take the region's lock: 0; -1 after LOCK_GIVE_UP_NS (a holder in another guest that
 * died holding it: only its own guest's processes can tell, and may never run again). */
static int lock(struct region *r)
{
	struct region_header *h = r->hdr;
	uint64_t start = mono_ns();
	for (unsigned spins = 0;; spins++) {
		uint32_t seen = 0;
		if (__atomic_compare_exchange_n(&h->lock, &seen, r->token, 0, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			break;
		uint64_t waited = spins % 1024 ? 0 : mono_ns() - start;
		if (waited >= LOCK_GIVE_UP_NS) return -1;
		if (waited >= LOCK_PATIENCE_NS && owner_dead(r, &h->lock_owner) &&
		    __atomic_compare_exchange_n(&h->lock, &seen, r->token, 0, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			break; /* the holder died holding it */
		sched_yield();
	}
	h->lock_owner = r->me;
	return 0;
}

static void unlock(struct region *r)
{
	__atomic_store_n(&r->hdr->lock, 0, __ATOMIC_RELEASE);
}

/* Under the lock: a zeroed (never used) region gets its header and a fresh id. */
static int init_header(struct region *r)
{
	struct region_header *h = r->hdr;
	if (h->magic == REGION_MAGIC) return 0;
	if (h->magic != 0) return -1;
	if (getrandom(h->id, sizeof h->id, 0) != (ssize_t)sizeof h->id) return -1;
	h->version = REGION_VERSION;
	h->slots = REGION_SLOTS;
	h->size = r->size;
	memset((void *)h->slot, 0, sizeof h->slot);
	memset((void *)h->member, 0, sizeof h->member);
	/* departures and epoch are kept: hpvc may write them into a zeroed region */
	__atomic_store_n(&h->magic, REGION_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

int region_attach(struct region *r, void *base, size_t size)
{
	_Static_assert(sizeof(struct region_header) <= REGION_DATA, "header too big");
	if (size < REGION_DATA + 4096 || base == NULL) return -1;
	r->hdr = base;
	r->size = size;
	uint64_t magic = __atomic_load_n(&r->hdr->magic, __ATOMIC_ACQUIRE);
	if (magic != 0 && magic != REGION_MAGIC) return -1; /* not ours: do not touch its lock */
	if (lock(r) != 0) return -1;
	int rc = init_header(r);
	unlock(r);
	if (rc != 0) return -1;
	struct region_header *h = r->hdr;
	int ours = h->version == REGION_VERSION && h->slots == REGION_SLOTS && h->size == size;
	return ours ? 0 : -1;
}

static int same_owner(const struct region_owner *a, const struct region_owner *b)
{
	return a->pid == b->pid && a->start == b->start && a->pidns == b->pidns &&
	       memcmp(a->boot, b->boot, sizeof a->boot) == 0;
}

/* The departure entry of `ip`, or NULL (read after an acquire load of the count). */
static const struct region_departure *departure_of(const struct region *r, uint32_t ip)
{
	uint32_t n = __atomic_load_n(&r->hdr->departures, __ATOMIC_ACQUIRE);
	if (n > REGION_DEPARTED) n = REGION_DEPARTED;
	for (uint32_t i = 0; i < n && ip; i++)
		if (r->hdr->departed[i].ip == ip) return &r->hdr->departed[i];
	return NULL;
}

/* Has the guest at `ip` gone from this host (REGION_GONE)? */
static int ip_gone(const struct region *r, uint32_t ip)
{
	const struct region_departure *d = departure_of(r, ip);
	return d && (__atomic_load_n(&d->epoch, __ATOMIC_ACQUIRE) & REGION_GONE);
}

/* Under the lock: the owners of member entries whose guest is gone, into `out`; how many. */
static uint32_t gone_owners(const struct region *r, const struct region_owner **out)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < REGION_MEMBERS; i++) {
		const struct region_member *m = &r->hdr->member[i];
		if (m->state == SLOT_USED && ip_gone(r, m->ip)) out[n++] = &m->owner;
	}
	return n;
}

static int owned_by_any(const struct region_slot *s, const struct region_owner **who, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (same_owner(&s->owner, who[i])) return 1;
	return 0;
}

static void quarantine(struct region_slot *s, uint64_t now)
{
	s->dead_since = now;
	__atomic_store_n(&s->state, SLOT_DEAD, __ATOMIC_RELEASE);
}

/* Under the lock: quarantine the segments of dead owners and of gone guests' members,
 * free those quarantined long enough. */
static void reclaim(struct region *r)
{
	uint64_t now = now_ns();
	const struct region_owner *gone[REGION_MEMBERS];
	uint32_t n_gone = gone_owners(r, gone);
	for (uint32_t i = 0; i < REGION_SLOTS; i++) {
		struct region_slot *s = &r->hdr->slot[i];
		if (s->state == SLOT_USED &&
		    (owner_dead(r, &s->owner) || owned_by_any(s, gone, n_gone))) {
			quarantine(s, now);
		} else if (s->state == SLOT_DEAD && now >= s->dead_since &&
			   now - s->dead_since >= r->quarantine_ns) {
			__atomic_store_n(&s->gen, s->gen + 1, __ATOMIC_RELEASE);
			__atomic_store_n(&s->state, SLOT_FREE, __ATOMIC_RELEASE);
		}
	}
}

static int by_offset(const void *a, const void *b)
{
	const struct region_slot *x = *(const struct region_slot *const *)a;
	const struct region_slot *y = *(const struct region_slot *const *)b;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Under the lock: the first gap of `length` bytes (0: the largest gap, in *largest). */
static int find_gap(const struct region *r, uint64_t length, uint64_t *at, uint64_t *largest)
{
	static const struct region_slot *taken[REGION_SLOTS];
	unsigned n = 0;
	for (uint32_t i = 0; i < REGION_SLOTS; i++)
		if (r->hdr->slot[i].state != SLOT_FREE) taken[n++] = &r->hdr->slot[i];
	qsort(taken, n, sizeof taken[0], by_offset);
	uint64_t cursor = REGION_DATA, best = 0;
	for (unsigned i = 0; i <= n; i++) {
		uint64_t end = i < n ? taken[i]->offset : r->size;
		uint64_t gap = end > cursor ? end - cursor : 0;
		if (length && gap >= length) {
			*at = cursor;
			return 0;
		}
		best = gap > best ? gap : best;
		if (i < n) cursor = (taken[i]->offset + taken[i]->length + REGION_ALIGN - 1) &
				    ~(uint64_t)(REGION_ALIGN - 1);
	}
	if (largest) *largest = best;
	return -1;
}

int region_alloc(struct region *r, size_t *length, uint64_t *seg_id, uint64_t *offset)
{
	uint64_t want = (*length + REGION_ALIGN - 1) & ~(uint64_t)(REGION_ALIGN - 1), at;
	int rc = -1;
	if (lock(r) != 0) return -1;
	reclaim(r);
	for (uint32_t i = 0; i < REGION_SLOTS && rc != 0; i++) {
		struct region_slot *s = &r->hdr->slot[i];
		if (s->state != SLOT_FREE) continue;
		if (find_gap(r, want, &at, NULL) != 0) break;
		s->offset = at;
		s->length = want;
		s->owner = r->me;
		__atomic_store_n(&s->state, SLOT_USED, __ATOMIC_RELEASE);
		*seg_id = region_seg_id(i, s->gen);
		*offset = at;
		*length = want;
		rc = 0;
	}
	unlock(r);
	return rc;
}

int region_free(struct region *r, uint64_t seg_id)
{
	uint32_t i = (uint32_t)seg_id, gen = (uint32_t)(seg_id >> 32);
	int rc = -1;
	if (i >= REGION_SLOTS || lock(r) != 0) return -1;
	struct region_slot *s = &r->hdr->slot[i];
	if (s->state == SLOT_USED && s->gen == gen && s->owner.pid == r->me.pid &&
	    memcmp(s->owner.boot, r->me.boot, sizeof s->owner.boot) == 0) {
		__atomic_store_n(&s->gen, gen + 1, __ATOMIC_RELEASE);
		__atomic_store_n(&s->state, SLOT_FREE, __ATOMIC_RELEASE);
		rc = 0;
	}
	unlock(r);
	return rc;
}

int region_seg_lookup(const struct region *r, uint64_t seg_id, uint64_t *offset,
		      uint64_t *length)
{
	uint32_t i = (uint32_t)seg_id, gen = (uint32_t)(seg_id >> 32);
	if (i >= REGION_SLOTS) return -1;
	const struct region_slot *s = &r->hdr->slot[i];
	if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != SLOT_USED ||
	    __atomic_load_n(&s->gen, __ATOMIC_ACQUIRE) != gen)
		return -1;
	if (s->offset < REGION_DATA || s->offset > r->size || s->length > r->size - s->offset)
		return -1;
	*offset = s->offset;
	*length = s->length;
	return 0;
}

size_t region_largest_free(struct region *r)
{
	uint64_t largest = 0, unused;
	if (lock(r) != 0) return 0;
	reclaim(r);
	int free_slot = 0;
	for (uint32_t i = 0; i < REGION_SLOTS && !free_slot; i++)
		free_slot = r->hdr->slot[i].state == SLOT_FREE;
	if (!free_slot || find_gap(r, 0, &unused, &largest) != 0) largest = free_slot ? largest : 0;
	unlock(r);
	return (size_t)largest;
}

int region_member_join(struct region *r, uint32_t ip)
{
	int index = -1;
	if (lock(r) != 0) return -1;
	for (uint32_t i = 0; i < REGION_MEMBERS && index < 0; i++) {
		struct region_member *m = &r->hdr->member[i];
		int gone = m->state == SLOT_USED && ip_gone(r, m->ip);
		if (m->state == SLOT_USED && !gone && !owner_dead(r, &m->owner)) continue;
		if (gone) { /* its segments lose their only link to the departure: quarantine now */
			for (uint32_t k = 0; k < REGION_SLOTS; k++)
				if (r->hdr->slot[k].state == SLOT_USED && same_owner(&r->hdr->slot[k].owner, &m->owner))
					quarantine(&r->hdr->slot[k], now_ns());
		}
		m->ip = ip;
		m->owner = r->me;
		m->busy = 0;
		m->seen = __atomic_load_n(&r->hdr->epoch, __ATOMIC_ACQUIRE);
		__atomic_store_n(&m->state, SLOT_USED, __ATOMIC_RELEASE);
		index = (int)i;
	}
	unlock(r);
	return index;
}

void region_member_leave(struct region *r, int index)
{
	if (index < 0 || (uint32_t)index >= REGION_MEMBERS) return;
	__atomic_store_n(&r->hdr->member[index].state, SLOT_FREE, __ATOMIC_RELEASE);
}

int region_departed(const struct region *r, uint32_t ip)
{
	return departure_of(r, ip) != NULL;
}
