/* libuct_ivshmem.so: a UCX 1.13 shared-memory transport ("ivshmem") whose segments are
 * carved out of one region that co-resident VM guests share (docs/vms.md, "MPI over the
 * shared region (UCX)"; docs/architecture.md, native/).
 *
 * It is UCX's own mm transport (src/uct/sm/mm/base: FIFO, receive descriptors, eager
 * and rendezvous over active messages) with a memory mapper of ours: where sysv and
 * posix ask the kernel for a segment per allocation, this mapper takes one from the
 * region's allocator (region.c) and a peer attaches it by its slot and generation.
 * The region is the ivshmem-plain device's BAR 2 in a guest (PCI 1af4:1110,
 * /sys/bus/pci/devices/<bdf>/resource2), or the file UCX_IVSHMEM_PATH names (host
 * tests, or to pick one of several devices).
 *
 * What differs from the stock mm transports, in the iface (iface_open below):
 * - reachability is "the same region": the device address is the region's 128-bit id,
 *   not the host's boot id that uct_sm_iface_is_reachable compares (guests differ);
 * - the device is "ivshmem", not "memory", so UCP does not close this iface as a
 *   duplicate of posix/sysv, which cannot reach other guests;
 * - no wake-up events (the FIFO's signal is a Unix socket, which does not cross guests),
 *   and no peer-failure checks (a pid from another guest means nothing here);
 * - the FIFO's owner pid is 1, not ours (issue 29): UCX's mm endpoint, when it connects,
 *   looks that pid up in ITS OWN /proc (uct_ep_keepalive_init in mm_ep.c) and fails the
 *   connection ("failed to get start time for pid N" -> Endpoint timeout, MPICH's
 *   MPI_Init) when the owner is in another guest or pid namespace (see iface_open).
 * No region, an unmappable one, or one with too little room left: the md reports no
 * resources, and UCP uses the other transports (TCP between guests).
 *
 * Long because a UCX component is one unit: the md, its mapper and the iface operations
 * are named together by UCT_MM_COMPONENT_DEFINE and UCT_TL_NAME below (the departure's
 * own code is apart, in fallback.c).
 *
 * Built against the source of the installed UCX (native/ucx/Makefile); loaded with
 * LD_PRELOAD, since UCX 1.13 loads only the modules named when it was built.
 */
#define _GNU_SOURCE
#include "fallback.h"
#include "region.h"

#include <uct/sm/mm/base/mm_iface.h>
#include <uct/sm/mm/base/mm_md.h>
#include <ucs/debug/log.h>

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define IVSHMEM_DEVICE_NAME "ivshmem"
/* Room one iface needs at open: its FIFO and one pool of 128 receive descriptors. */
#define IVSHMEM_MIN_FREE (2u << 20)

typedef struct {
	uint64_t seg_id;
	uintptr_t owner_ptr;
} UCS_S_PACKED uct_ivshmem_packed_rkey_t;

typedef struct {
	uct_mm_md_config_t super;
	char *path;
} uct_ivshmem_md_config_t;

static ucs_config_field_t uct_ivshmem_md_config_table[] = {
	{"MM_", "", NULL, ucs_offsetof(uct_ivshmem_md_config_t, super),
	 UCS_CONFIG_TYPE_TABLE(uct_mm_md_config_table)},
	{"PATH", "",
	 "File to use as the shared region; empty: BAR 2 of the first ivshmem PCI device",
	 ucs_offsetof(uct_ivshmem_md_config_t, path), UCS_CONFIG_TYPE_STRING},
	{NULL}};

static ucs_config_field_t uct_ivshmem_iface_config_table[] = {
	{"MM_", "RX_BUFS_GROW=128", NULL, 0, UCS_CONFIG_TYPE_TABLE(uct_mm_iface_config_table)},
	{NULL}};

/* --- the region, mapped once per process ----------------------------------------------- */

static struct region g_region;
static int g_region_ok;
static pthread_once_t g_region_once = PTHREAD_ONCE_INIT;

static long sysfs_hex(const char *dir, const char *name)
{
	char path[PATH_MAX], text[32];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, text, sizeof text - 1);
	if (fd >= 0) close(fd);
	if (n <= 0) return -1;
	text[n] = '\0';
	return strtol(text, NULL, 16);
}

/* resource2 of the first ivshmem device in address order (enabled, best effort): 0, -1. */
static int find_bar(char *out, size_t size)
{
	const char *base = "/sys/bus/pci/devices";
	char dir[PATH_MAX];
	struct dirent **names;
	int n = scandir(base, &names, NULL, alphasort), found = -1;
	for (int i = 0; i < n; i++) {
		snprintf(dir, sizeof dir, "%s/%s", base, names[i]->d_name);
		if (found != 0 && names[i]->d_name[0] != '.' && sysfs_hex(dir, "vendor") == 0x1af4 &&
		    sysfs_hex(dir, "device") == 0x1110) {
			if (sysfs_hex(dir, "enable") == 0) {
				char path[PATH_MAX + 8];
				snprintf(path, sizeof path, "%s/enable", dir);
				int fd = open(path, O_WRONLY | O_CLOEXEC);
				if (fd >= 0 && write(fd, "1", 1) < 0) ucs_debug("ivshmem: enable %s: %m", dir);
				if (fd >= 0) close(fd);
			}
			found = snprintf(out, size, "%s/resource2", dir) < (int)size ? 0 : -1;
		}
		free(names[i]);
	}
	if (n >= 0) free(names);
	return found;
}

static void region_open(void)
{
	char path[PATH_MAX];
	const char *env = getenv("UCX_IVSHMEM_PATH");
	struct stat st;
	if (env && *env) snprintf(path, sizeof path, "%s", env);
	else if (find_bar(path, sizeof path) != 0) {
		ucs_debug("ivshmem: no ivshmem PCI device (1af4:1110) and no UCX_IVSHMEM_PATH");
		return;
	}
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0) {
		ucs_debug("ivshmem: cannot open %s: %m", path);
		if (fd >= 0) close(fd);
		return;
	}
	void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (base == MAP_FAILED) {
		ucs_debug("ivshmem: cannot map %s: %m", path);
		return;
	}
	if (region_identity(&g_region) != 0 || region_attach(&g_region, base, (size_t)st.st_size)) {
		ucs_warn("ivshmem: %s is not a usable region (too small, or holds something else)",
			 path);
		munmap(base, (size_t)st.st_size);
		return;
	}
	if (fb_start(&g_region) != 0) return; /* the member table is full: not offered */
	g_region_ok = 1;
}

__attribute__((destructor)) static void region_close(void)
{
	if (g_region_ok) fb_stop();
}

static int region_ready(void)
{
	pthread_once(&g_region_once, region_open);
	return g_region_ok;
}

static void *region_at(uint64_t offset)
{
	return (char *)g_region.hdr + offset;
}

/* --- the memory mapper ------------------------------------------------------------------ */

static ucs_status_t uct_ivshmem_md_query(uct_md_h md, uct_md_attr_t *md_attr)
{
	uct_mm_md_query(md, md_attr, g_region.size - REGION_DATA);
	md_attr->rkey_packed_size = sizeof(uct_ivshmem_packed_rkey_t);
	return UCS_OK;
}

static ucs_status_t uct_ivshmem_mem_alloc(uct_md_h md, size_t *length_p, void **address_p,
					  ucs_memory_type_t mem_type, unsigned flags,
					  const char *alloc_name, uct_mem_h *memh_p)
{
	uct_mm_seg_t *seg;
	uint64_t seg_id, offset;
	size_t length = *length_p;
	if (mem_type != UCS_MEMORY_TYPE_HOST) return UCS_ERR_UNSUPPORTED;
	if (region_alloc(&g_region, &length, &seg_id, &offset) != 0) {
		ucs_debug("ivshmem: no room for %zu bytes (%s)", *length_p, alloc_name);
		return UCS_ERR_NO_MEMORY;
	}
	ucs_status_t status = uct_mm_seg_new(region_at(offset), length, &seg);
	if (status != UCS_OK) {
		region_free(&g_region, seg_id);
		return status;
	}
	seg->seg_id = seg_id;
	*address_p = seg->address;
	*length_p = seg->length;
	*memh_p = seg;
	return UCS_OK;
}

static ucs_status_t uct_ivshmem_mem_free(uct_md_h md, uct_mem_h memh)
{
	uct_mm_seg_t *seg = memh;
	if (region_free(&g_region, seg->seg_id) != 0)
		ucs_debug("ivshmem: segment 0x%" PRIx64 " was not ours any more", seg->seg_id);
	ucs_free(seg);
	return UCS_OK;
}

static ucs_status_t uct_ivshmem_mkey_pack(uct_md_h md, uct_mem_h memh,
					  const uct_md_mkey_pack_params_t *params, void *buffer)
{
	uct_ivshmem_packed_rkey_t *rkey = buffer;
	const uct_mm_seg_t *seg = memh;
	rkey->seg_id = seg->seg_id;
	rkey->owner_ptr = (uintptr_t)seg->address;
	return UCS_OK;
}

static unsigned g_ifaces; /* this process's open ivshmem ifaces */

/* Available: the region maps, and has room for one more iface. Once an iface is open
 * the answer stays yes: UCX's mm iface asks again in its own query and aborts on no. */
static ucs_status_t uct_ivshmem_query(int *attach_shm_file_p)
{
	if (!region_ready()) return UCS_ERR_UNSUPPORTED;
	size_t room = __atomic_load_n(&g_ifaces, __ATOMIC_RELAXED) ? IVSHMEM_MIN_FREE
								    : region_largest_free(&g_region);
	if (room < IVSHMEM_MIN_FREE) {
		ucs_debug("ivshmem: region full (%zu bytes left), not offered", room);
		return UCS_ERR_UNSUPPORTED; /* anything else fails UCX's whole context */
	}
	*attach_shm_file_p = 0; /* no peer-failure checks: see the file's comment */
	return UCS_OK;
}

/* The peer's segment, if it is still the one the id names (else a stale id). */
static ucs_status_t seg_address(uct_mm_seg_id_t seg_id, void **address_p)
{
	uint64_t offset, length;
	if (!region_ready()) return UCS_ERR_UNREACHABLE; /* a peer's rkey, but no region here */
	if (region_seg_lookup(&g_region, seg_id, &offset, &length) != 0) {
		ucs_debug("ivshmem: segment 0x%" PRIx64 " is gone (freed or reused)", seg_id);
		return UCS_ERR_SHMEM_SEGMENT;
	}
	*address_p = region_at(offset);
	return UCS_OK;
}

static ucs_status_t uct_ivshmem_mem_attach(uct_mm_md_t *md, uct_mm_seg_id_t seg_id,
					   size_t length, const void *iface_addr,
					   uct_mm_remote_seg_t *rseg)
{
	rseg->cookie = NULL;
	return seg_address(seg_id, &rseg->address);
}

static void uct_ivshmem_mem_detach(uct_mm_md_t *md, const uct_mm_remote_seg_t *rseg)
{
}

static int uct_ivshmem_is_reachable(uct_mm_md_t *md, uct_mm_seg_id_t seg_id,
				    const void *iface_addr)
{
	void *address;
	return seg_address(seg_id, &address) == UCS_OK;
}

static ucs_status_t uct_ivshmem_rkey_unpack(uct_component_t *component, const void *buffer,
					    uct_rkey_t *rkey_p, void **handle_p)
{
	const uct_ivshmem_packed_rkey_t *rkey = buffer;
	void *address;
	ucs_status_t status = seg_address(rkey->seg_id, &address);
	if (status != UCS_OK) return status;
	*handle_p = NULL;
	uct_mm_md_make_rkey(address, rkey->owner_ptr, rkey_p);
	return UCS_OK;
}

static ucs_status_t uct_ivshmem_rkey_release(uct_component_t *component, uct_rkey_t rkey,
					     void *handle)
{
	return UCS_OK;
}

/* The mapper's part of an iface address: how to reach this process off the region. */
static size_t uct_ivshmem_iface_addr_length(uct_mm_md_t *md)
{
	return sizeof(fb_addr_t);
}

static ucs_status_t uct_ivshmem_iface_addr_pack(uct_mm_md_t *md, void *buffer)
{
	fb_addr_pack(buffer);
	return UCS_OK;
}

static uct_mm_md_mapper_ops_t uct_ivshmem_md_ops = {
	.super = {.close = uct_mm_md_close,
		  .query = uct_ivshmem_md_query,
		  .mem_alloc = uct_ivshmem_mem_alloc,
		  .mem_free = uct_ivshmem_mem_free,
		  .mem_advise = ucs_empty_function_return_unsupported,
		  .mem_reg = ucs_empty_function_return_unsupported,
		  .mem_dereg = ucs_empty_function_return_unsupported,
		  .mkey_pack = uct_ivshmem_mkey_pack,
		  .is_sockaddr_accessible = ucs_empty_function_return_zero_int,
		  .detect_memory_type = ucs_empty_function_return_unsupported},
	.query = uct_ivshmem_query,
	.iface_addr_length = uct_ivshmem_iface_addr_length,
	.iface_addr_pack = uct_ivshmem_iface_addr_pack,
	.mem_attach = uct_ivshmem_mem_attach,
	.mem_detach = uct_ivshmem_mem_detach,
	.is_reachable = uct_ivshmem_is_reachable};

UCT_MM_COMPONENT_DEFINE(ivshmem, &uct_ivshmem_md_ops, uct_ivshmem_rkey_unpack,
			uct_ivshmem_rkey_release, "IVSHMEM_")

/* --- the iface: UCX's mm iface with "same region" reachability ---------------------------- */

static uct_iface_query_func_t mm_iface_query;
static uct_iface_close_func_t mm_iface_close;

static void uct_ivshmem_iface_close(uct_iface_h iface)
{
	fb_forget_iface(iface);
	mm_iface_close(iface);
	__atomic_sub_fetch(&g_ifaces, 1, __ATOMIC_RELAXED);
}

static ucs_status_t uct_ivshmem_iface_query(uct_iface_h iface, uct_iface_attr_t *attr)
{
	ucs_status_t status = mm_iface_query(iface, attr);
	if (status != UCS_OK) return status;
	attr->device_addr_len = REGION_ID_LEN;
	attr->cap.event_flags = 0;
	attr->cap.flags &= ~(uint64_t)UCT_IFACE_FLAG_EP_CHECK;
	/* Active messages only: what a departure can carry over TCP (fallback.c). UCP's
	 * rendezvous goes over active messages here anyway (no zero-copy), and its RMA
	 * lanes need memory this md cannot register. */
	attr->cap.flags &= ~(uint64_t)(UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY |
				       UCT_IFACE_FLAG_GET_BCOPY | UCT_IFACE_FLAG_ATOMIC_CPU |
				       UCT_IFACE_FLAG_ATOMIC_DEVICE);
	memset(&attr->cap.atomic32, 0, sizeof attr->cap.atomic32);
	memset(&attr->cap.atomic64, 0, sizeof attr->cap.atomic64);
	return UCS_OK;
}

static ucs_status_t uct_ivshmem_iface_get_device_address(uct_iface_h iface,
							 uct_device_addr_t *addr)
{
	memcpy(addr, g_region.hdr->id, REGION_ID_LEN);
	return UCS_OK;
}

static int uct_ivshmem_iface_is_reachable(const uct_iface_h iface,
					  const uct_device_addr_t *dev_addr,
					  const uct_iface_addr_t *iface_addr)
{
	const uct_mm_iface_addr_t *addr = (const void *)iface_addr;
	void *fifo;
	if (dev_addr == NULL || memcmp(dev_addr, g_region.hdr->id, REGION_ID_LEN) != 0) return 0;
	if (iface_addr == NULL) return 1;
	/* A guest that left (or this one, in its copy of the region) is not reached here. */
	if (!fb_reachable((const fb_addr_t *)(addr + 1))) return 0;
	return seg_address(addr->fifo_seg_id, &fifo) == UCS_OK;
}

static ucs_status_t uct_ivshmem_iface_open(uct_md_h md, uct_worker_h worker,
					   const uct_iface_params_t *params,
					   const uct_iface_config_t *config, uct_iface_h *iface_p)
{
	ucs_status_t status =
		UCS_CLASS_NEW_FUNC_NAME(uct_mm_iface_t)(md, worker, params, config, iface_p);
	if (status != UCS_OK) return status;
	__atomic_add_fetch(&g_ifaces, 1, __ATOMIC_RELAXED);
	uct_iface_ops_t *ops = &(*iface_p)->ops;
	mm_iface_close = ops->iface_close;
	ops->iface_close = uct_ivshmem_iface_close;
	mm_iface_query = ops->iface_query;
	ops->iface_query = uct_ivshmem_iface_query;
	ops->iface_get_device_address = uct_ivshmem_iface_get_device_address;
	ops->iface_is_reachable = uct_ivshmem_iface_is_reachable;
	/* Never armed, so a sender never sets the FIFO's "event armed" bit and never sends
	 * to our wake-up socket's name, which another kernel would resolve to its own
	 * abstract socket of that name (someone else's, or nobody's). */
	ops->iface_event_fd_get = (uct_iface_event_fd_get_func_t)
		ucs_empty_function_return_unsupported;
	ops->iface_event_arm = (uct_iface_event_arm_func_t)ucs_empty_function_return_unsupported;
	/* The peer reads this pid when it connects (uct_ep_keepalive_init, mm_ep.c) and on
	 * sends with a peer check (uct_ep_keepalive_check), in its own /proc: a peer in
	 * another guest (another kernel) or pid namespace finds some other process there,
	 * or none (then UCX refuses the endpoint). Pid 1 exists in every guest and every
	 * pid namespace and is never reused while that namespace lives, so the lookup
	 * always succeeds and its start time never changes: liveness is not judged by pid
	 * across kernels at all (EP_CHECK is off in iface_query; a dead peer's segments are
	 * reclaimed by region.c, which compares boot id and pid namespace first). Set
	 * before the iface's address is handed out, so no peer ever saw our own pid.
	 * (A /proc mounted with hidepid=2 hides pid 1 from other users: not done in
	 * hpvc's guests.) */
	ucs_derived_of(*iface_p, uct_mm_iface_t)->recv_fifo_ctl->pid = 1;
	fb_install(*iface_p); /* sends, flushes and progress that can leave the region */
	return UCS_OK;
}

static ucs_status_t uct_ivshmem_query_devices(uct_md_h md, uct_tl_device_resource_t **devices_p,
					      unsigned *num_devices_p)
{
	return uct_single_device_resource(md, IVSHMEM_DEVICE_NAME, UCT_DEVICE_TYPE_SHM,
					  UCS_SYS_DEVICE_ID_UNKNOWN, devices_p, num_devices_p);
}

uct_tl_t UCT_TL_NAME(ivshmem) = {
	.name = "ivshmem",
	.query_devices = uct_ivshmem_query_devices,
	.iface_open = uct_ivshmem_iface_open,
	.config = {.name = "ivshmem transport",
		   .prefix = "IVSHMEM_",
		   .table = uct_ivshmem_iface_config_table,
		   .size = sizeof(uct_mm_iface_config_t)}};

UCT_SINGLE_TL_INIT(&uct_ivshmem_component.super, ivshmem, ctor, , )
