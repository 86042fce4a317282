/* The ivshmem transport's way off the region (fallback.c): when hpvc says a guest leaves
 * the host, the endpoints to and from it carry their active messages over TCP. */
#ifndef HPVC_UCX_FALLBACK_H
#define HPVC_UCX_FALLBACK_H

#include "region.h"

#include <uct/api/uct.h>

/* What a peer needs to reach this process off the region: the mapper-specific part of
 * the iface address (mm_ivshmem.c's iface_addr_pack). */
typedef struct {
	uint32_t ip; /* network order; 0: no fallback address */
	uint16_t port; /* network order */
	uint16_t member; /* the process's entry in region.h's member table */
} __attribute__((packed)) fb_addr_t;

/* At the first iface open: the fallback address, the listening socket and the member
 * entry: 0, or -1 (the region's member table is full: the transport is not offered). */
int fb_start(struct region *r);
/* At the last iface close. */
void fb_stop(void);
/* Wrap an mm iface's endpoint, flush and progress operations (after it opened). */
void fb_install(uct_iface_h iface);
/* Before the iface closes: its incoming connections go. */
void fb_forget_iface(uct_iface_h iface);
void fb_addr_pack(void *buffer);
/* 0 when this process's or the peer's address has left the region. */
int fb_reachable(const fb_addr_t *peer);

#endif
