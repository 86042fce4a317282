/* The shared region's own layout and allocator: what libuct_ivshmem.so (mm_ivshmem.c)
 * carves its UCX segments from, kept apart from UCX so test_alloc.c can test it alone.
 *
 * The region is one memory area mapped by every process that uses it: in a guest the
 * ivshmem-plain device's BAR 2 (docs/vms.md, "Shared memory between co-resident
 * guests"), on a host any file (UCX_IVSHMEM_PATH). It begins with a header:
 *
 *   magic, version, size, a lock word and the lock holder's identity,
 *   a 128-bit region id (random, set under the lock by the first user),
 *   a table of REGION_SLOTS segment slots {state, generation, offset, length, owner},
 *   the departures: an epoch and the IPv4 addresses of guests that leave the host,
 *   written by hpvc on the host only (hpvc.host.region_departure),
 *   a table of REGION_MEMBERS members, one per process with the transport open
 *   {state, address, the departure epoch it has acted on, a busy count, owner},
 *
 * and the rest (from REGION_DATA) is carved into segments, first fit. A segment is
 * named by its slot and the slot's generation (region_seg_id); freeing a slot bumps
 * its generation, so a peer holding an old id is refused (region_seg_lookup) instead
 * of reading someone else's data. A process is an owner {boot id, pid namespace, pid,
 * start time}; a segment whose owner has died (judged only by processes of the same
 * kernel and pid namespace: another guest's pids mean nothing here) is quarantined
 * for REGION_QUARANTINE_NS, so a peer still writing into it does not hit new data,
 * then reused. So is a segment of a member whose guest is gone (REGION_GONE): its
 * kernel left the host, and no process here could judge it dead.
 */
#ifndef HPVC_UCX_REGION_H
#define HPVC_UCX_REGION_H

#include <stddef.h>
#include <stdint.h>

#define REGION_MAGIC 0x48535649435650ULL /* "PVCIVSH" */
#define REGION_VERSION 2u
#define REGION_SLOTS 512u
#define REGION_DATA 65536u /* the header's size: segments start here */
#define REGION_ALIGN 4096u /* segments start on pages: no two processes share a line */
#define REGION_QUARANTINE_NS (5ull * 1000000000ull)
#define REGION_ID_LEN 16
#define REGION_MEMBERS 128u
#define REGION_DEPARTED 32u
/* In a departure's epoch: the guest's move ended, it runs on another host now, and none
 * of its processes uses this region again: what they held here may be taken back. */
#define REGION_GONE 0x80000000u

enum { SLOT_FREE = 0, SLOT_USED = 1, SLOT_DEAD = 2 };

struct region_owner {
	uint8_t boot[16]; /* /proc/sys/kernel/random/boot_id: one per kernel (guest) */
	uint64_t pidns;	  /* inode of /proc/self/ns/pid */
	uint64_t start;	  /* start time in clock ticks since boot (/proc/PID/stat 22) */
	uint32_t pid;
	uint32_t pad;
};

struct region_slot {
	volatile uint32_t state;
	volatile uint32_t gen;
	uint64_t offset;
	uint64_t length;
	uint64_t dead_since; /* CLOCK_REALTIME ns when found dead */
	struct region_owner owner;
};

/* A process with the transport open (fallback.c). `busy` counts its sends and progress
 * calls in flight (each may write a peer's FIFO); `seen` is the departure epoch it has
 * acted on. hpvc moves a guest away only when every member has seen the epoch or is
 * not busy (fallback.c, "the departure"). One cache line each: `busy` changes per send. */
struct region_member {
	volatile uint32_t state; /* SLOT_FREE or SLOT_USED */
	uint32_t ip;		 /* its fallback address, IPv4 in network order (0: none) */
	volatile uint32_t seen;
	volatile uint32_t busy;
	struct region_owner owner;
	uint8_t pad[8];
};

/* A guest that leaves (or left) the host: every endpoint to or from `ip` goes over TCP
 * from `epoch` on. hpvc adds REGION_GONE to `epoch` once the guest runs elsewhere. */
struct region_departure {
	uint32_t ip; /* network order */
	uint32_t epoch;
};

struct region_header {
	volatile uint64_t magic;
	uint32_t version;
	uint32_t slots;
	uint64_t size;
	volatile uint32_t lock; /* 0 free, else the holder's token */
	uint32_t pad;
	struct region_owner lock_owner;
	uint8_t id[REGION_ID_LEN];
	struct region_slot slot[REGION_SLOTS];
	volatile uint32_t epoch; /* bumped by hpvc after it appends to departed[] */
	volatile uint32_t departures;
	struct region_departure departed[REGION_DEPARTED];
	struct region_member member[REGION_MEMBERS] __attribute__((aligned(64)));
};

/* A mapped region as this process sees it. */
struct region {
	struct region_header *hdr;
	size_t size;
	struct region_owner me;
	uint32_t token;	       /* what this process writes into the lock word */
	uint64_t quarantine_ns; /* REGION_QUARANTINE_NS (tests shorten it) */
};

/* Fill r->me, r->token and r->quarantine_ns (from /proc, the default): 0, or -1. */
int region_identity(struct region *r);
/* Use `base`/`size` as the region, initialising its header on first use: 0; -1 when the
 * area is too small or holds something else (another magic or version). */
int region_attach(struct region *r, void *base, size_t size);
/* A segment of at least `length` bytes: 0 with *seg_id, *offset, *length set; -1 full. */
int region_alloc(struct region *r, size_t *length, uint64_t *seg_id, uint64_t *offset);
/* Give back a segment this process owns: 0, or -1 (not ours, stale). */
int region_free(struct region *r, uint64_t seg_id);
/* Where a live segment is: 0 with *offset and *length, or -1 (bad or stale id). */
int region_seg_lookup(const struct region *r, uint64_t seg_id, uint64_t *offset,
		      uint64_t *length);
/* Bytes left for segments (the largest gap), reclaiming dead owners first. */
size_t region_largest_free(struct region *r);

/* A member entry for this process, whose fallback address is `ip`: its index, or -1
 * (table full). Entries of dead processes of this kernel, and of guests that are gone
 * (their segments quarantined then), are taken back first. */
int region_member_join(struct region *r, uint32_t ip);
void region_member_leave(struct region *r, int index);
/* Whether `ip` is among the departures (read after an acquire load of hdr->epoch). */
int region_departed(const struct region *r, uint32_t ip);

static inline uint64_t region_seg_id(uint32_t slot, uint32_t gen)
{
	return ((uint64_t)gen << 32) | slot;
}

#endif
