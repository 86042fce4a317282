/* kvmguest: the whole userland of the bare guest that scripts/kvm-kit/run.py
 * boots on a KVM host, where hpvc's own guests (a Debian rootfs on a disk)
 * cannot be carried: PID 1 of an initramfs, built static.
 *
 * As PID 1 it mounts /proc, /sys and /dev, reads its role from the kernel
 * command line and runs it:
 *   kg.mode=tick [kg.write=MIB]  a byte on /dev/ttyS1 every millisecond (the
 *                                host times their arrival: the guest's pauses
 *                                seen from outside, as a kvmclock guest's own
 *                                clock does not see them), and with kg.write
 *                                a thread writing every page of MIB MiB over
 *                                and over (the migration's dirtying load);
 *   kg.mode=ping|pong [kg.n=N]   a round-trip ping-pong through the ivshmem
 *                                region (BAR 2 of the 1af4:1110 device), the
 *                                ping side printing min/median/p99 in ns.
 * Run on the host as `kvmguest ping|pong FILE [N]` it does the same ping-pong
 * through a shared file: the native figure the guests' is compared with.
 * Every result is one line starting "kg-" on the console. Issue 27 and 29
 * figures on KVM; docs/benchmarks.md "On a KVM host". */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define LINE 64

static char cmdline[4096];

static const char *arg(const char *key, const char *dflt)
{
	static char val[256];
	size_t k = strlen(key);
	for (char *p = cmdline; (p = strstr(p, key)); p += k) {
		if ((p == cmdline || p[-1] == ' ') && p[k] == '=') {
			size_t n = strcspn(p + k + 1, " \n");
			if (n >= sizeof(val))
				n = sizeof(val) - 1;
			memcpy(val, p + k + 1, n);
			val[n] = 0;
			return val;
		}
	}
	return dflt;
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static size_t write_mib;

static void *writer(void *unused)
{
	(void)unused;
	size_t len = write_mib << 20;
	volatile unsigned char *buf = malloc(len);
	if (!buf) {
		printf("kg-error writer: no %zu MiB\n", write_mib);
		return NULL;
	}
	for (unsigned char v = 1;; v++)
		for (size_t i = 0; i < len; i += 4096)
			buf[i] = v;
	return NULL;
}

static int tick(void)
{
	int fd = open("/dev/ttyS1", O_WRONLY | O_NOCTTY);
	if (fd < 0) {
		perror("kg-error ttyS1");
		return 1;
	}
	struct termios t;
	if (tcgetattr(fd, &t) == 0) {
		cfmakeraw(&t);
		cfsetospeed(&t, B115200);
		tcsetattr(fd, TCSANOW, &t);
	}
	write_mib = strtoul(arg("kg.write", "0"), NULL, 10);
	pthread_t th;
	if (write_mib && pthread_create(&th, NULL, writer, NULL) != 0) {
		printf("kg-error no writer thread\n");
		return 1;
	}
	printf("kg-ready tick write=%zu\n", write_mib);
	fflush(stdout);
	struct timespec ms = {0, 1000000};
	for (;;) {
		if (write(fd, "t", 1) != 1)
			return 1;
		nanosleep(&ms, NULL);
	}
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Ping writes seq into line 0 and waits for it in line 1; pong echoes it. */
static int pingpong(volatile unsigned char *base, int ping, long n)
{
	volatile uint64_t *out = (volatile uint64_t *)(base + (ping ? 0 : LINE));
	volatile uint64_t *in = (volatile uint64_t *)(base + (ping ? LINE : 0));
	long warm = n / 10;
	uint64_t *rtt = ping ? calloc((size_t)n, sizeof(*rtt)) : NULL;
	if (ping && !rtt)
		return 1;
	if (ping) {
		*in = 0;
		*out = 0;
	}
	for (long i = 1; i <= warm + n; i++) {
		uint64_t t0 = now_ns();
		if (ping) {
			*out = (uint64_t)i;
			while (*in != (uint64_t)i)
				__builtin_ia32_pause();
			if (i > warm)
				rtt[i - warm - 1] = now_ns() - t0;
		} else {
			while (*in != (uint64_t)i)
				__builtin_ia32_pause();
			*out = (uint64_t)i;
		}
	}
	if (ping) {
		qsort(rtt, (size_t)n, sizeof(*rtt), cmp);
		printf("kg-shm n=%ld rtt_ns min=%llu median=%llu p99=%llu\n", n,
		       (unsigned long long)rtt[0], (unsigned long long)rtt[n / 2],
		       (unsigned long long)rtt[n * 99 / 100]);
	} else {
		printf("kg-shm pong done n=%ld\n", n);
	}
	fflush(stdout);
	return 0;
}

static volatile unsigned char *map_file(const char *path, size_t len)
{
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return NULL;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static volatile unsigned char *map_ivshmem(void)
{
	DIR *d = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	char path[512], id[32];
	while (d && (e = readdir(d))) {
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/device", e->d_name);
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, id, sizeof(id) - 1);
		close(fd);
		if (n > 0 && strncmp(id, "0x1110", 6) == 0) {
			snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource2", e->d_name);
			closedir(d);
			return map_file(path, 4096);
		}
	}
	if (d)
		closedir(d);
	return NULL;
}

static int as_init(void)
{
	mount("proc", "/proc", "proc", 0, NULL);
	mount("sysfs", "/sys", "sysfs", 0, NULL);
	mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
	int fd = open("/proc/cmdline", O_RDONLY);
	if (fd >= 0) {
		ssize_t n = read(fd, cmdline, sizeof(cmdline) - 1);
		cmdline[n > 0 ? n : 0] = 0;
		close(fd);
	}
	char mode[16]; /* arg() returns one static buffer: keep the mode apart */
	snprintf(mode, sizeof(mode), "%s", arg("kg.mode", "tick"));
	long n = atol(arg("kg.n", "200000"));
	int rc;
	if (strcmp(mode, "tick") == 0) {
		rc = tick();
	} else {
		volatile unsigned char *shm = map_ivshmem();
		if (!shm) {
			printf("kg-error no ivshmem BAR 2\n");
			rc = 1;
		} else {
			printf("kg-ready %s\n", mode);
			fflush(stdout);
			rc = pingpong(shm, strcmp(mode, "ping") == 0, n);
		}
	}
	fflush(stdout);
	sync();
	reboot(RB_POWER_OFF);
	return rc;
}

int main(int argc, char **argv)
{
	if (getpid() == 1)
		return as_init();
	if (argc < 3 || (strcmp(argv[1], "ping") && strcmp(argv[1], "pong"))) {
		fprintf(stderr, "usage: kvmguest ping|pong FILE [N]\n");
		return 2;
	}
	volatile unsigned char *shm = map_file(argv[2], 4096);
	if (!shm) {
		perror(argv[2]);
		return 1;
	}
	return pingpong(shm, strcmp(argv[1], "ping") == 0, argc > 3 ? atol(argv[3]) : 200000);
}
