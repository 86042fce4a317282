/* hpvc-shm: read and write the memory region that co-resident hpvc VMs share.
 *
 * The region is BAR 2 of the ivshmem-plain PCI device (vendor 0x1af4, device 0x1110),
 * one host file mapped by every VM of the cluster on that host. hpvc-shm finds the
 * device under /sys/bus/pci/devices (the first one in address order), enables it if
 * no driver did, and maps its resource2 file:
 *
 *   hpvc-shm info                  print "pci=ADDRESS size=BYTES" (the BAR size)
 *   hpvc-shm write OFFSET STRING   copy the bytes of STRING (no NUL) to OFFSET
 *   hpvc-shm read OFFSET LEN       print LEN bytes from OFFSET, then a newline
 *
 * OFFSET and LEN are decimal, or hex with 0x. Exit status: 0 done; 1 failed (no
 * device, cannot map it); 2 bad usage or a range outside the region. Errors are one
 * "hpvc-shm: ..." line on stderr. HPVC_SHM_SYSFS (default /sys) is the sysfs root.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define VENDOR 0x1af4
#define DEVICE 0x1110 /* ivshmem; ivshmem-plain has no doorbell, the same IDs */
#define EXIT_USAGE 2

static const char usage[] = "usage: hpvc-shm info | write OFFSET STRING | read OFFSET LEN";

/* One "hpvc-shm: ..." line on stderr; returns `code` so callers can `return fail(...)`. */
static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n = snprintf(line, sizeof line, "hpvc-shm: ");
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	n = (int)strlen(line);
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, (size_t)n);
	return code;
}

/* A hex number from a one-line sysfs file (e.g. "0x1af4\n"); -1 when unreadable. */
static long read_hex(const char *path)
{
	char buf[32];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	if (fd >= 0) close(fd);
	if (n <= 0) return -1;
	buf[n] = '\0';
	char *end;
	errno = 0;
	long v = strtol(buf, &end, 16);
	return errno || end == buf ? -1 : v;
}

/* The device directory of the first ivshmem device: 0 found, -1 none. */
static int find_device(const char *sysfs, char *dir, size_t size, const char **addr)
{
	char base[PATH_MAX], path[PATH_MAX + 300];
	struct dirent **names;
	int found = -1;
	snprintf(base, sizeof base, "%s/bus/pci/devices", sysfs);
	int n = scandir(base, &names, NULL, alphasort);
	if (n < 0) return -1;
	for (int i = 0; i < n; i++) {
		const char *name = names[i]->d_name;
		if (found == 0 || name[0] == '.') continue;
		snprintf(path, sizeof path, "%s/%s/vendor", base, name);
		if (read_hex(path) != VENDOR) continue;
		snprintf(path, sizeof path, "%s/%s/device", base, name);
		if (read_hex(path) != DEVICE) continue;
		if ((size_t)snprintf(dir, size, "%s/%s", base, name) >= size) continue;
		*addr = strrchr(dir, '/') + 1;
		found = 0;
	}
	for (int i = 0; i < n; i++) free(names[i]);
	free(names);
	return found;
}

/* Turn on memory decoding when no driver has (writing 1 to "enable"); best effort. */
static void enable_device(const char *dir)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/enable", dir);
	if (read_hex(path) != 0) return; /* enabled, or no such file */
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) return;
	(void)!write(fd, "1", 1);
	close(fd);
}

/* A non-negative number (decimal or 0x hex) that fits in size_t: 0, or -1. */
static int parse_size(const char *s, size_t *out)
{
	char *end;
	if (!*s || *s == '-' || *s == '+' || *s == ' ') return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end || v > SIZE_MAX) return -1;
	*out = (size_t)v;
	return 0;
}

struct region {
	char dir[PATH_MAX];
	const char *addr;
	unsigned char *base;
	size_t size;
};

/* Find, enable and (when `prot` is not PROT_NONE) map the region: 0, or an exit status. */
static int open_region(struct region *r, int prot)
{
	const char *sysfs = getenv("HPVC_SHM_SYSFS");
	char path[PATH_MAX + 16];
	struct stat st;
	if (!sysfs || !*sysfs) sysfs = "/sys";
	if (find_device(sysfs, r->dir, sizeof r->dir, &r->addr) != 0)
		return fail(1, "no ivshmem-plain device (1af4:1110) under %s/bus/pci/devices", sysfs);
	enable_device(r->dir);
	snprintf(path, sizeof path, "%s/resource2", r->dir);
	int fd = open(path, (prot & PROT_WRITE ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0) {
		int code = fail(1, "%s: %s", path, strerror(errno));
		if (fd >= 0) close(fd);
		return code;
	}
	r->size = (size_t)st.st_size;
	if (r->size == 0) {
		close(fd);
		return fail(1, "%s: the BAR is empty", path);
	}
	r->base = NULL;
	if (prot != PROT_NONE) {
		void *p = mmap(NULL, r->size, prot, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			int code = fail(1, "mmap %s: %s", path, strerror(errno));
			close(fd);
			return code;
		}
		r->base = p;
	}
	close(fd);
	return 0;
}

/* Check that [offset, offset+len) lies in the region: 0, or an exit status. */
static int check_range(const struct region *r, size_t offset, size_t len)
{
	if (offset > r->size || len > r->size - offset)
		return fail(EXIT_USAGE, "%zu bytes at offset %zu: outside the %zu-byte region", len,
			    offset, r->size);
	return 0;
}

static int write_all(int fd, const unsigned char *p, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR) continue;
		if (n <= 0) return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int cmd_info(void)
{
	struct region r;
	int code = open_region(&r, PROT_NONE);
	if (code) return code;
	printf("pci=%s size=%zu\n", r.addr, r.size);
	return fflush(stdout) == 0 ? 0 : fail(1, "stdout: %s", strerror(errno));
}

static int cmd_write(const char *off, const char *text)
{
	struct region r;
	size_t offset, len = strlen(text);
	if (parse_size(off, &offset) != 0) return fail(EXIT_USAGE, "bad offset %s", off);
	int code = open_region(&r, PROT_READ | PROT_WRITE);
	if (code) return code;
	if (!(code = check_range(&r, offset, len))) {
		memcpy(r.base + offset, text, len);
		__sync_synchronize();
	}
	munmap(r.base, r.size);
	return code;
}

static int cmd_read(const char *off, const char *count)
{
	struct region r;
	size_t offset, len;
	if (parse_size(off, &offset) != 0) return fail(EXIT_USAGE, "bad offset %s", off);
	if (parse_size(count, &len) != 0) return fail(EXIT_USAGE, "bad length %s", count);
	int code = open_region(&r, PROT_READ);
	if (code) return code;
	if (!(code = check_range(&r, offset, len))) {
		__sync_synchronize();
		if (write_all(STDOUT_FILENO, r.base + offset, len) != 0 ||
		    write_all(STDOUT_FILENO, (const unsigned char *)"\n", 1) != 0)
			code = fail(1, "stdout: %s", strerror(errno));
	}
	munmap(r.base, r.size);
	return code;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "info") == 0) return cmd_info();
	if (argc == 4 && strcmp(argv[1], "write") == 0) return cmd_write(argv[2], argv[3]);
	if (argc == 4 && strcmp(argv[1], "read") == 0) return cmd_read(argv[2], argv[3]);
	return fail(EXIT_USAGE, "%s", usage);
}
