/* test_alloc: the shared region's allocator (region.c) on its own, without UCX.
 *
 * Each check prints "ok NAME" or "not ok NAME: why"; the exit status is the number of
 * failed checks (tests/unit/test_ucx_region.py runs it and wants every name, all ok).
 * Regions are anonymous shared mappings; "dead" owners are children that exit without
 * freeing, so the dead-owner rules run against real /proc entries.
 *
 * Two helpers for tests/integration/test_ucx_ivshmem.py, on a region file:
 *   test_alloc show PATH   print "used=N dead=N free=N largest=BYTES" (reclaims first)
 *   test_alloc hold PATH   take the largest gaps until the region is full, print
 *                          "held N", and give them back when stdin closes
 *   test_alloc layout      print the header's offsets that hpvc.host.region_departure
 *                          writes and reads, as "name=N" words
 */
#define _GNU_SOURCE
#include "region.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE (4u << 20)

static int failed;

static void check(int good, const char *name, const char *why)
{
	if (good) printf("ok %s\n", name);
	else printf("not ok %s: %s\n", name, why);
	failed += !good;
}

static void *fresh(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) exit(99);
	return p;
}

static int attach(struct region *r, void *base, size_t size)
{
	return region_identity(r) == 0 ? region_attach(r, base, size) : -1;
}

static void test_header(void)
{
	struct region a, b, c;
	void *base = fresh(SIZE), *other = fresh(SIZE);
	static const uint8_t zero[REGION_ID_LEN];
	check(attach(&a, base, SIZE) == 0 && memcmp(a.hdr->id, zero, sizeof zero) != 0,
	      "first_use_sets_an_id", "no region id after the first attach");
	check(attach(&b, base, SIZE) == 0 && memcmp(a.hdr->id, b.hdr->id, REGION_ID_LEN) == 0,
	      "second_attach_keeps_the_id", "the id changed");
	check(attach(&c, other, SIZE) == 0 && memcmp(a.hdr->id, c.hdr->id, REGION_ID_LEN) != 0,
	      "two_regions_two_ids", "two regions got the same id");
	memset(other, 0x5a, 64);
	check(attach(&c, other, SIZE) != 0, "foreign_data_refused", "took a region with other data");
	check(attach(&c, fresh(8192), 8192) != 0, "too_small_refused", "took an 8 KiB region");
}

static void test_alloc_free(void)
{
	struct region r;
	uint64_t ids[64], off, len, old;
	size_t n = 0, want = 256 << 10;
	attach(&r, fresh(SIZE), SIZE);
	size_t before = region_largest_free(&r);
	while (n < 64 && region_alloc(&r, &want, &ids[n], &off) == 0) n++;
	check(n > 4 && n < 16, "fills_up", "not about SIZE/256K segments before full");
	check(region_largest_free(&r) < (256 << 10), "full_reported", "room left after full");
	int apart = 1;
	for (size_t i = 1; i < n; i++) {
		uint64_t o1, l1, o2, l2;
		region_seg_lookup(&r, ids[i - 1], &o1, &l1);
		region_seg_lookup(&r, ids[i], &o2, &l2);
		apart &= o1 + l1 <= o2 && o2 >= REGION_DATA && o2 + l2 <= SIZE;
	}
	check(apart, "segments_apart", "segments overlap or leave the region");
	old = ids[1];
	check(region_free(&r, old) == 0, "free", "cannot free own segment");
	check(region_seg_lookup(&r, old, &off, &len) != 0, "freed_id_refused", "freed id looked up");
	check(region_free(&r, old) != 0, "double_free_refused", "freed twice");
	check(region_alloc(&r, &want, &ids[1], &off) == 0 && ids[1] != old &&
		      (uint32_t)ids[1] == (uint32_t)old,
	      "reuse_changes_generation", "reused slot kept its generation");
	check(region_seg_lookup(&r, old, &off, &len) != 0, "stale_id_refused_after_reuse",
	      "an old id reads the new owner's segment");
	for (size_t i = 0; i < n; i++) region_free(&r, ids[i]);
	check(region_largest_free(&r) == before, "all_back", "room not back after freeing all");
}

/* A child allocates one segment, writes its id into *out and exits without freeing;
 * `reap` 0 leaves it a zombie (waited for with WNOWAIT). */
static pid_t child_allocates(struct region *r, uint64_t *out, int reap)
{
	pid_t pid = fork();
	if (pid == 0) {
		struct region mine;
		size_t len = 4096;
		uint64_t off;
		if (attach(&mine, r->hdr, r->size) != 0 || region_alloc(&mine, &len, out, &off)) _exit(1);
		_exit(0);
	}
	siginfo_t info;
	waitid(P_PID, (id_t)pid, &info, WEXITED | (reap ? 0 : WNOWAIT));
	return pid;
}

static void test_dead_owner(void)
{
	struct region r;
	uint64_t *shared = fresh(4096), off, len, mine;
	size_t want = 4096;
	attach(&r, fresh(SIZE), SIZE);
	child_allocates(&r, shared, 1);
	uint64_t dead = shared[0];
	check(region_seg_lookup(&r, dead, &off, &len) == 0, "dead_owner_seen_until_reclaim",
	      "the child's segment is not there");
	region_alloc(&r, &want, &mine, &off); /* reclaims: the child's slot is quarantined */
	check(region_seg_lookup(&r, dead, &off, &len) != 0, "dead_owner_refused",
	      "a dead owner's segment is still offered");
	check(r.hdr->slot[(uint32_t)dead].state == SLOT_DEAD, "dead_owner_quarantined",
	      "reused at once");
	r.quarantine_ns = 0;
	region_largest_free(&r);
	check(r.hdr->slot[(uint32_t)dead].state == SLOT_FREE &&
		      r.hdr->slot[(uint32_t)dead].gen == (uint32_t)(dead >> 32) + 1,
	      "dead_owner_freed_after_quarantine", "not freed, or the generation unchanged");
	/* An owner of another kernel (guest) is never judged here, even if its pid is gone. */
	child_allocates(&r, shared, 1);
	r.hdr->slot[(uint32_t)shared[0]].owner.boot[0] ^= 0xff;
	region_largest_free(&r);
	check(region_seg_lookup(&r, shared[0], &off, &len) == 0, "other_guest_not_judged",
	      "reclaimed a segment of another kernel's process");
	/* A zombie (an MPI rank whose launcher is gone, not reaped) maps nothing any more. */
	pid_t zombie = child_allocates(&r, shared, 0);
	region_largest_free(&r);
	check(region_seg_lookup(&r, shared[0], &off, &len) != 0, "zombie_owner_refused",
	      "a zombie's segment is still offered");
	waitpid(zombie, NULL, 0);
}

static void test_dead_lock_holder(void)
{
	struct region r;
	uint64_t off, id;
	size_t want = 4096;
	attach(&r, fresh(SIZE), SIZE);
	pid_t pid = fork();
	if (pid == 0) { /* take the lock and die holding it */
		struct region mine;
		if (attach(&mine, r.hdr, r.size) != 0) _exit(1);
		mine.hdr->lock = mine.token;
		mine.hdr->lock_owner = mine.me;
		_exit(0);
	}
	waitpid(pid, NULL, 0);
	check(region_alloc(&r, &want, &id, &off) == 0 && r.hdr->lock == 0,
	      "dead_lock_holder_broken", "stuck behind a dead holder's lock");
}

static int map_file(struct region *r, const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	off_t size = fd < 0 ? -1 : lseek(fd, 0, SEEK_END);
	void *base = size <= 0 ? MAP_FAILED
			       : mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fd >= 0) close(fd);
	if (base == MAP_FAILED || attach(r, base, (size_t)size) != 0) {
		fprintf(stderr, "test_alloc: %s: not a usable region\n", path);
		return -1;
	}
	return 0;
}

static int show(const char *path)
{
	struct region r;
	unsigned count[3] = {0, 0, 0};
	if (map_file(&r, path) != 0) return 2;
	size_t largest = region_largest_free(&r);
	for (uint32_t i = 0; i < REGION_SLOTS; i++) count[r.hdr->slot[i].state % 3]++;
	printf("used=%u dead=%u free=%u largest=%zu\n", count[SLOT_USED], count[SLOT_DEAD],
	       count[SLOT_FREE], largest);
	return 0;
}

static int hold(const char *path)
{
	struct region r;
	static uint64_t ids[REGION_SLOTS];
	uint64_t off;
	unsigned n = 0;
	char c;
	if (map_file(&r, path) != 0) return 2;
	for (size_t len; n < REGION_SLOTS && (len = region_largest_free(&r)) >= 4096; n++)
		if (region_alloc(&r, &len, &ids[n], &off) != 0) break;
	printf("held %u\n", n);
	while (read(STDIN_FILENO, &c, 1) > 0) continue;
	while (n > 0) region_free(&r, ids[--n]);
	return 0;
}

static void test_members(void)
{
	struct region a, b;
	void *base = fresh(SIZE);
	attach(&a, base, SIZE);
	attach(&b, base, SIZE);
	int i = region_member_join(&a, 0x0200007f), j = region_member_join(&b, 0x0300007f);
	check(i >= 0 && j >= 0 && i != j && a.hdr->member[i].ip == 0x0200007f,
	      "members_join_apart", "two joins did not get two entries");
	region_member_leave(&a, i);
	check(region_member_join(&b, 1) == i, "left_member_reused", "a left entry was not reused");
	int n = 0;
	while (region_member_join(&a, 7) >= 0) n++;
	check(n == (int)REGION_MEMBERS - 2, "member_table_fills", "the table never said full");
	a.hdr->departed[0].ip = 0x0300007f;
	__atomic_store_n(&a.hdr->departures, 1, __ATOMIC_RELEASE);
	check(region_departed(&a, 0x0300007f) && !region_departed(&a, 0x0200007f) &&
		      !region_departed(&a, 0),
	      "departure_found", "the departures list was misread");
	/* hpvc writes a departure into a region no process has used yet */
	struct region_header *h = fresh(SIZE);
	h->departed[0].ip = 0x0400007f;
	h->departed[0].epoch = 1;
	h->departures = 1;
	h->epoch = 1;
	attach(&b, h, SIZE);
	int k = region_member_join(&b, 0x0200007f);
	check(h->magic == REGION_MAGIC && region_departed(&b, 0x0400007f) && k >= 0 &&
		      h->member[k].seen == 1,
	      "departure_kept_at_first_use", "setting up the header dropped the departure");
}

/* "Another guest": this process's identity with another kernel's boot id. */
static void as_guest(struct region *g, void *base, uint8_t kernel)
{
	attach(g, base, SIZE);
	g->me.boot[0] ^= kernel;
}

static void test_gone(void)
{
	struct region a, g3, g4, g5;
	void *base = fresh(SIZE);
	uint64_t s3[2], s4, s5, off;
	size_t want = 4096;
	attach(&a, base, SIZE);
	as_guest(&g3, base, 0x11);
	as_guest(&g4, base, 0x22);
	as_guest(&g5, base, 0x33);
	int m3 = region_member_join(&g3, 0x0300007f);
	region_member_join(&g4, 0x0400007f);
	int m5 = region_member_join(&g5, 0x0500007f);
	region_alloc(&g3, &want, &s3[0], &off);
	region_alloc(&g3, &want, &s3[1], &off);
	region_alloc(&g4, &want, &s4, &off);
	region_alloc(&g5, &want, &s5, &off);
	struct region_header *h = a.hdr;
	h->departed[0].ip = 0x0300007f;
	h->departed[0].epoch = 1;
	h->departed[1].ip = 0x0500007f;
	h->departed[1].epoch = 2 | REGION_GONE;
	h->departures = 2;
	h->epoch = 2;
	region_largest_free(&a);
	check(h->slot[(uint32_t)s3[0]].state == SLOT_USED && h->slot[(uint32_t)s4].state == SLOT_USED,
	      "departing_guest_kept", "took back segments of a guest still on the host");
	h->departed[0].epoch |= REGION_GONE; /* hpvc: the move of .3 ended */
	a.quarantine_ns = 5000000000ull;
	region_largest_free(&a);
	check(h->slot[(uint32_t)s3[0]].state == SLOT_DEAD && h->slot[(uint32_t)s3[1]].state == SLOT_DEAD,
	      "gone_guest_quarantined", "a gone guest's segments are not quarantined");
	check(h->slot[(uint32_t)s4].state == SLOT_USED, "other_guest_kept",
	      "took back a segment of a guest that did not leave");
	a.quarantine_ns = 0;
	region_largest_free(&a);
	check(h->slot[(uint32_t)s3[0]].state == SLOT_FREE && region_seg_lookup(&a, s3[0], &off, &off),
	      "gone_guest_freed", "not freed after the quarantine");
	/* .5 is gone too, but a join takes its member entry first (index order: .3's is
	 * earlier, so this takes .3's, the next .5's): its segment must not leak then */
	int j1 = region_member_join(&a, 0x0200007f);
	h->slot[(uint32_t)s5].state = SLOT_USED; /* as if no reclaim had run since */
	int j2 = region_member_join(&a, 0x0600007f);
	check(j1 == m3 && j2 == m5, "gone_member_reused", "a gone guest's entry was not reused");
	check(h->slot[(uint32_t)s5].state == SLOT_DEAD, "gone_member_segments_quarantined",
	      "reusing a gone guest's entry left its segments to no one");
}

static int layout(void)
{
	printf("version=%u magic=%llu epoch=%zu departures=%zu departed=%zu departed_max=%u "
	       "member=%zu member_size=%zu members=%u member_ip=%zu member_seen=%zu "
	       "member_busy=%zu member_pid=%zu data=%u gone=%u\n",
	       REGION_VERSION, (unsigned long long)REGION_MAGIC,
	       offsetof(struct region_header, epoch), offsetof(struct region_header, departures),
	       offsetof(struct region_header, departed), REGION_DEPARTED,
	       offsetof(struct region_header, member), sizeof(struct region_member),
	       REGION_MEMBERS, offsetof(struct region_member, ip),
	       offsetof(struct region_member, seen), offsetof(struct region_member, busy),
	       offsetof(struct region_member, owner.pid), REGION_DATA, REGION_GONE);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && strcmp(argv[1], "show") == 0) return show(argv[2]);
	if (argc == 3 && strcmp(argv[1], "hold") == 0) return hold(argv[2]);
	if (argc == 2 && strcmp(argv[1], "layout") == 0) return layout();
	test_header();
	test_alloc_free();
	test_dead_owner();
	test_dead_lock_holder();
	test_members();
	test_gone();
	return failed;
}
