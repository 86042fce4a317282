/* hpvc-init: the boot chain of an hpvc virtual machine, one static binary in two roles.
 *
 *   /init            (initramfs) mount /proc /sys /dev, load the modules listed in
 *                    /modules/order in that order, wait for the root disk (root=,
 *                    default /dev/vda), mount it (ext4) on /newroot, move /dev there,
 *                    switch root (MS_MOVE + chroot), exec /sbin/hpvc-init; on error,
 *                    power off. /sbin/hpvc-init (PID 1 of the guest) mounts the API
 *                    filesystems, sets the hostname, brings up lo and eth0, gives the
 *                    ivshmem region's PCI files to root alone (the device enabled), installs
 *                    root's ssh key, starts the agent that runs Slurm tasks on eth0's
 *                    address (native/agent) with the job's key (QEMU's fw_cfg entry
 *                    opt/hpvc/agent-key, kept in /run/hpvc/agent-key), starts sshd when the
 *                    image has one (/usr/sbin/sshd), reaps zombies; SIGTERM/SIGPWR: power off.
 *
 * Settings come from the kernel command line: hpvc.name=NAME, hpvc.ip=A.B.C.D/N,
 * hpvc.mtu=N, hpvc.key=BASE64 (the authorized_keys line in standard base64, so its
 * comment may hold spaces), hpvc.peers=BASE64 (the cluster's name, then "IP MAC NAME"
 * per node, a line each: /etc/hosts and permanent ARP entries, before sshd starts),
 * hpvc.binds=BASE64 ("TAG PATH" lines: virtiofs mounts of the host folders a Slurm site
 * shares, whose modules the initramfs then loads from /modules/binds). Errors are "hpvc-init: ..." lines on the console. Once sshd
 * accepts connections on 127.0.0.1:22 (or gave up), or, in an image without sshd (an
 * imported one: hpvc then reaches the node through the agent alone), once the agent
 * listens, exactly one line follows: "hpvc-ready NAME" if every step succeeded, else
 * "hpvc-failed NAME".
 *
 * Long because it is the guest's whole boot, read top to bottom in the order it
 * runs: both roles are one static binary and share its helpers (the command
 * line, mounts, failing), and every step is a short function of its own.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define NEWROOT "/newroot"
#define STAGE2 "/sbin/hpvc-init"
#define MODULES "/modules"
#define TICK_MS 50
#define ROOT_WAIT_MS 30000
#define SSHD_WAIT_MS 60000
#define HOST_KEY "/etc/ssh/ssh_host_ed25519_key"
#define SSHD "/usr/sbin/sshd"

static int failed; /* a step went wrong: announce hpvc-failed instead of hpvc-ready */

/* Print "hpvc-init: ..." in one write (the line stays whole); mark the boot failed. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n = snprintf(line, sizeof line, "hpvc-init: ");
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	n = (int)strlen(line);
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, (size_t)n);
	failed = 1;
	return -1;
}

/* An initramfs step failed: say what and why (errno), then power off. */
static void __attribute__((noreturn)) die(const char *what)
{
	fail("%s: %s; powering off", what, strerror(errno));
	sync();
	reboot(RB_POWER_OFF);
	_exit(1); /* not reached; if it were, the kernel panics (panic=-1 resets) */
}

/* The value of KEY=... on the kernel command line: 1 found, 0 absent, -1 too long. */
static int cmdline_get(const char *key, char *out, size_t size)
{
	static char cmdline[4096];
	size_t klen = strlen(key);
	if (!cmdline[0]) {
		int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
		ssize_t n = fd < 0 ? -1 : read(fd, cmdline, sizeof cmdline - 1);
		if (fd >= 0) close(fd);
		if (n <= 0) return 0;
		cmdline[n] = '\0';
	}
	for (const char *p = cmdline; *p; p += strspn(p, " \n")) {
		size_t len = strcspn(p, " \n");
		if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
			if (len - klen - 1 >= size) return -1;
			memcpy(out, p + klen + 1, len - klen - 1);
			out[len - klen - 1] = '\0';
			return 1;
		}
		p += len;
	}
	return 0;
}

/* ---- role 1: /init in the initramfs ------------------------------------------------- */

static void must_mount(const char *src, const char *dir, const char *type, unsigned long flags)
{
	if (mount(src, dir, type, flags, NULL) != 0) die(dir);
}

/* finit_module each file named in the list (if load), then delete it (frees its memory). */
static void load_list(const char *list, int load)
{
	char name[128], path[256];
	FILE *order = fopen(list, "re");
	if (!order) die(list);
	while (fgets(name, sizeof name, order)) {
		name[strcspn(name, "\n")] = '\0';
		if (!name[0]) continue;
		snprintf(path, sizeof path, MODULES "/%s", name);
		int fd = load ? open(path, O_RDONLY | O_CLOEXEC) : -1;
		if (load && (fd < 0 || (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST)))
			die(path);
		if (fd >= 0) close(fd);
		unlink(path);
	}
	fclose(order);
	unlink(list);
}

/* /modules/order, then /modules/binds (virtiofs) only for a command line with
 * hpvc.binds= (host folders to mount; an initramfs without that list has none). */
static void load_modules(void)
{
	char probe[2];
	load_list(MODULES "/order", 1);
	if (access(MODULES "/binds", F_OK) == 0)
		load_list(MODULES "/binds", cmdline_get("hpvc.binds", probe, sizeof probe) != 0);
	rmdir(MODULES);
}

static int initramfs_main(void)
{
	char root[64] = "/dev/vda", what[128];
	struct stat st;
	must_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID);
	int fd = open("/dev/console", O_RDWR | O_NOCTTY);
	for (int i = 0; fd >= 0 && i < 3; i++) dup2(fd, i);
	if (fd > 2) close(fd);
	must_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC);
	must_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC);
	load_modules();
	if (cmdline_get("root", root, sizeof root) < 0) die("root= is too long");
	for (int waited = 0; stat(root, &st) != 0; waited += TICK_MS) {
		if (waited >= ROOT_WAIT_MS) {
			snprintf(what, sizeof what, "root disk %s did not appear in %d s", root,
				 ROOT_WAIT_MS / 1000);
			die(what);
		}
		usleep(TICK_MS * 1000);
	}
	must_mount(root, NEWROOT, "ext4", 0);
	if (mount("/dev", NEWROOT "/dev", NULL, MS_MOVE, NULL) != 0) die("move /dev");
	umount2("/proc", MNT_DETACH);
	umount2("/sys", MNT_DETACH);
	unlink("/init");
	if (chdir(NEWROOT) != 0 || mount(".", "/", NULL, MS_MOVE, NULL) != 0) die("move " NEWROOT);
	if (chroot(".") != 0 || chdir("/") != 0) die("chroot " NEWROOT);
	execl(STAGE2, STAGE2, (char *)NULL);
	die("exec " STAGE2);
}

/* ---- role 2: /sbin/hpvc-init, PID 1 of the guest ------------------------------------ */

static void mount_api_filesystems(void)
{
	static const struct { const char *type, *dir, *data; unsigned long flags; } api[] = {
		{ "proc", "/proc", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC },
		{ "sysfs", "/sys", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC },
		{ "devtmpfs", "/dev", "mode=0755", MS_NOSUID },
		{ "devpts", "/dev/pts", "gid=5,mode=620,ptmxmode=666", MS_NOSUID | MS_NOEXEC },
		{ "tmpfs", "/dev/shm", "mode=1777", MS_NOSUID | MS_NODEV },
		{ "tmpfs", "/run", "mode=0755", MS_NOSUID | MS_NODEV },
		{ "tmpfs", "/tmp", "mode=1777", MS_NOSUID | MS_NODEV },
	};
	struct stat here, parent;
	char up[64];
	for (size_t i = 0; i < sizeof api / sizeof api[0]; i++) {
		snprintf(up, sizeof up, "%s/..", api[i].dir);
		if (mkdir(api[i].dir, 0755) != 0 && errno != EEXIST)
			fail("mkdir %s: %s", api[i].dir, strerror(errno));
		else if (stat(api[i].dir, &here) == 0 && stat(up, &parent) == 0 &&
			 here.st_dev != parent.st_dev)
			continue; /* already a mount point: /dev, moved here by the initramfs */
		else if (mount(api[i].type, api[i].dir, api[i].type, api[i].flags, api[i].data) != 0)
			fail("mount %s on %s: %s", api[i].type, api[i].dir, strerror(errno));
	}
	(void)!symlink("/proc/self/fd", "/dev/fd");
}

#define INET_ADDRESS(addr, port)                                              \
	((struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons(port), \
			       .sin_addr.s_addr = (addr) })

static int if_request(int fd, unsigned long req, struct ifreq *ifr, const char *what)
{
	if (ioctl(fd, req, ifr) == 0) return 0;
	return fail("%s: %s: %s", ifr->ifr_name, what, strerror(errno));
}

static int if_up(int fd, struct ifreq *ifr)
{
	if (if_request(fd, SIOCGIFFLAGS, ifr, "get flags") != 0) return -1;
	ifr->ifr_flags |= IFF_UP | IFF_RUNNING;
	return if_request(fd, SIOCSIFFLAGS, ifr, "bring up");
}

/* eth0 gets A.B.C.D/N and the MTU; the subnet route comes with the address. */
static int configure_eth0(int fd, char *cidr, int mtu)
{
	struct ifreq ifr = { .ifr_name = "eth0" };
	struct in_addr addr;
	char *slash = strchr(cidr, '/'), *end = NULL;
	long prefix = slash ? strtol(slash + 1, &end, 10) : -1;
	if (!slash || *end || prefix < 0 || prefix > 32)
		return fail("hpvc.ip=%s: want A.B.C.D/N", cidr);
	*slash = '\0';
	if (inet_pton(AF_INET, cidr, &addr) != 1)
		return fail("hpvc.ip=%s: not an IPv4 address", cidr);
	struct sockaddr_in sin = INET_ADDRESS(addr.s_addr, 0);
	memcpy(&ifr.ifr_addr, &sin, sizeof sin);
	if (if_request(fd, SIOCSIFADDR, &ifr, "set address") != 0) return -1;
	sin = INET_ADDRESS(prefix ? htonl(~0u << (32 - prefix)) : 0, 0);
	memcpy(&ifr.ifr_netmask, &sin, sizeof sin);
	if (if_request(fd, SIOCSIFNETMASK, &ifr, "set netmask") != 0) return -1;
	ifr.ifr_mtu = mtu;
	if (mtu > 0 && if_request(fd, SIOCSIFMTU, &ifr, "set mtu") != 0) return -1;
	return if_up(fd, &ifr);
}

/* The job's agent key, from QEMU's fw_cfg entry (never on a command line, which
 * every user reads), into /run/hpvc/agent-key (root's alone, for hpvc-rsh): its
 * length, or 0 when the node has none (its agent then refuses everyone). */
static int agent_key(unsigned char key[HPVC_AGENT_KEY_MAX])
{
	static const char fw[] = "/sys/firmware/qemu_fw_cfg/by_name/opt/hpvc/agent-key/raw";
	int n = hpvc_agent_read_key(fw, key);
	if (n < 0) { /* a guest booted by hand: it works, but takes no tasks (not a failure) */
		dprintf(STDERR_FILENO, "hpvc-init: no agent key (%s: %s): the agent refuses every client\n",
			fw, strerror(errno));
		return 0;
	}
	if (mkdir("/run/hpvc", 0700) != 0 && errno != EEXIST)
		fail("mkdir /run/hpvc: %s", strerror(errno));
	int fd = open(HPVC_AGENT_KEY_FILE, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || fchmod(fd, 0600) != 0 || write(fd, key, (size_t)n) != n)
		fail("write %s: %s (hpvc-rsh needs it)", HPVC_AGENT_KEY_FILE, strerror(errno));
	if (fd >= 0)
		close(fd);
	return n;
}

/* The agent (native/agent/server.c) on eth0's address, before the ready line:
 * a node that says it is ready takes tasks. */
static int start_agent(void)
{
	char ip[64];
	unsigned char key[HPVC_AGENT_KEY_MAX];
	if (cmdline_get("hpvc.ip", ip, sizeof ip) <= 0)
		return 0; /* no cluster address: nothing to listen on */
	char *slash = strchr(ip, '/');
	if (!slash)
		return fail("hpvc.ip=%s: want A.B.C.D/N", ip);
	*slash = '\0';
	int klen = agent_key(key);
	if (hpvc_agent_start(ip, atoi(slash + 1), key, (size_t)klen) < 0)
		return fail("agent on %s port %d: %s", ip, HPVC_AGENT_PORT, strerror(errno));
	return 0;
}

static int configure_network(void)
{
	char ip[64], mtu[16] = "0";
	struct ifreq lo = { .ifr_name = "lo" };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail("socket: %s", strerror(errno));
	if_up(fd, &lo);
	int has_ip = cmdline_get("hpvc.ip", ip, sizeof ip);
	if (has_ip < 0 || cmdline_get("hpvc.mtu", mtu, sizeof mtu) < 0)
		fail("hpvc.ip= or hpvc.mtu= is too long");
	else if (has_ip)
		configure_eth0(fd, ip, atoi(mtu));
	return close(fd);
}

/* Standard base64 ('=' padding optional): the length, or -1 on a bad digit or overflow. */
static long b64_decode(const char *in, unsigned char *out, size_t cap)
{
	static const char digits[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	unsigned long acc = 0;
	size_t n = 0;
	for (int bits = 0; *in && *in != '='; in++) {
		const char *at = strchr(digits, *in);
		if (!at || n >= cap) return -1;
		acc = ((acc << 6) | (unsigned long)(at - digits)) & 0xffffff;
		if ((bits += 6) >= 8) out[n++] = (unsigned char)(acc >> (bits -= 8));
	}
	return (long)n;
}

/* /root/.ssh/authorized_keys (mode 600, directory 700) from hpvc.key=, for sshd
 * (an image without one gets no /root/.ssh). */
static int install_key(void)
{
	char b64[2048];
	unsigned char key[1600];
	int found = access(SSHD, X_OK) == 0 ? cmdline_get("hpvc.key", b64, sizeof b64) : 0;
	if (found <= 0)
		return found < 0 ? fail("hpvc.key= is too long") : 0;
	long n = b64_decode(b64, key, sizeof key - 1);
	for (long i = 0; i < n; i++)
		if (key[i] < 0x20 || key[i] == 0x7f) n = -1;
	if (n <= 0)
		return fail("hpvc.key=: not the base64 of one authorized_keys line");
	key[n++] = '\n';
	mkdir("/root", 0700);
	if ((mkdir("/root/.ssh", 0700) != 0 && errno != EEXIST) || chmod("/root/.ssh", 0700) != 0)
		return fail("mkdir /root/.ssh: %s", strerror(errno));
	int fd = open("/root/.ssh/authorized_keys",
		      O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || fchmod(fd, 0600) != 0 || write(fd, key, (size_t)n) != n || fsync(fd) != 0)
		fail("write /root/.ssh/authorized_keys: %s", strerror(errno));
	return fd >= 0 ? close(fd) : -1;
}

/* One permanent ARP entry on eth0 (what `ip neigh replace ... nud permanent` makes). */
static int add_neighbour(int fd, const char *ip, const char *mac)
{
	struct arpreq r;
	struct sockaddr_in *pa = (struct sockaddr_in *)&r.arp_pa;
	unsigned int b[6];
	char more;
	memset(&r, 0, sizeof r);
	pa->sin_family = AF_INET;
	if (inet_pton(AF_INET, ip, &pa->sin_addr) != 1 ||
	    sscanf(mac, "%2x:%2x:%2x:%2x:%2x:%2x%c", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5],
		   &more) != 6)
		return fail("hpvc.peers=: bad entry %s %s", ip, mac);
	r.arp_ha.sa_family = ARPHRD_ETHER;
	for (int i = 0; i < 6; i++)
		r.arp_ha.sa_data[i] = (char)b[i];
	r.arp_flags = ATF_PERM | ATF_COM;
	strcpy(r.arp_dev, "eth0");
	if (ioctl(fd, SIOCSARP, &r) != 0)
		return fail("arp %s %s on eth0: %s", ip, mac, strerror(errno));
	return 0;
}

/* /etc/hosts (as hpvc renders it for every node) and the other nodes' permanent ARP
 * entries from hpvc.peers=: the guest knows its cluster from its first moment, and
 * hpvc needs no ssh round after boot. Absent (a cluster too big for the command
 * line): hpvc configures the guest over ssh instead. */
static int install_peers(void)
{
	static char b64[2048], text[1600];
	char own[64] = "";
	int found = cmdline_get("hpvc.peers", b64, sizeof b64);
	if (found <= 0)
		return found < 0 ? fail("hpvc.peers= is too long") : 0;
	long n = b64_decode(b64, (unsigned char *)text, sizeof text - 1);
	if (n <= 0)
		return fail("hpvc.peers=: not base64");
	text[n] = '\0';
	if (cmdline_get("hpvc.ip", own, sizeof own) > 0 && strchr(own, '/'))
		*strchr(own, '/') = '\0';
	char *save = NULL, *line = strtok_r(text, "\n", &save);
	int hosts = open("/etc/hosts", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (!line || hosts < 0 || fd < 0) {
		fail("hpvc.peers=: %s", !line ? "empty" : strerror(errno));
		goto out;
	}
	dprintf(hosts, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
		       "# hpvc cluster %s\n", line);
	while ((line = strtok_r(NULL, "\n", &save))) {
		char ip[64], mac[32], node[64];
		if (sscanf(line, "%63s %31s %63s", ip, mac, node) != 3) {
			fail("hpvc.peers=: bad line %.80s", line);
			continue;
		}
		dprintf(hosts, "%s\t%s\n", ip, node);
		if (strcmp(ip, own) != 0)
			add_neighbour(fd, ip, mac);
	}
	if (fsync(hosts) != 0)
		fail("write /etc/hosts: %s", strerror(errno));
out:
	if (fd >= 0) close(fd);
	return hosts >= 0 ? close(hosts) : -1;
}

/* ---- the ivshmem region co-resident guests share (PCI 1af4:1110, BAR 2) ------------- */

#define PCI_DEVICES "/sys/bus/pci/devices"

/* The first line of a sysfs file as a number (base 0: "0x1af4", "1"); -1 when unreadable. */
static long sysfs_number(const char *dir, const char *name)
{
	char path[512], buf[32];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	if (fd >= 0) close(fd);
	if (n <= 0) return -1;
	buf[n] = '\0';
	return strtol(buf, NULL, 0);
}

/* One ivshmem device: memory decoding on (as no driver binds it), and its region
 * files root's alone, 0600: the job's user in hpvc's guests is root (the agent runs
 * Slurm tasks as root, hpvc run's ranks come in over root's ssh), so the UCX
 * transport (native/ucx) maps resource2 without writing to sysfs, and no other user
 * of the guest can map, read or write the region (the kernel's default is 0600 too;
 * here it is said, and checked by tests/integration/test_vm_ucx_ivshmem.py). */
static void expose_one_ivshmem(const char *dir)
{
	static const char *const region[] = { "resource2", "resource2_wc" };
	char path[512];
	if (sysfs_number(dir, "enable") == 0) {
		snprintf(path, sizeof path, "%s/enable", dir);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, "1", 1) != 1)
			fail("enable %s: %s", dir, strerror(errno));
		if (fd >= 0) close(fd);
	}
	for (size_t i = 0; i < sizeof region / sizeof region[0]; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, region[i]);
		if (access(path, F_OK) != 0) continue; /* no write-combining file: fine */
		if (chown(path, 0, 0) != 0 || chmod(path, 0600) != 0)
			fail("%s: %s", path, strerror(errno));
	}
}

/* Every ivshmem-plain device of the guest (hpvc gives one where the guest shares a
 * host with others of its cluster; none otherwise, which is no failure). */
static void expose_ivshmem(void)
{
	char dir[384];
	DIR *d = opendir(PCI_DEVICES);
	if (!d) return;
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.') continue;
		snprintf(dir, sizeof dir, PCI_DEVICES "/%s", e->d_name);
		if (sysfs_number(dir, "vendor") == 0x1af4 && sysfs_number(dir, "device") == 0x1110)
			expose_one_ivshmem(dir);
	}
	closedir(d);
}

/* ---- host folders shared into the guest (virtiofs, served as the job's user) ------- */

/* mkdir -p path (0755 for what it makes); 0 or -1 with errno. */
static int make_dirs(char *path)
{
	for (char *p = path + 1;; p++) {
		if (*p != '/' && *p) continue;
		char c = *p;
		*p = '\0';
		int bad = mkdir(path, 0755) != 0 && errno != EEXIST;
		*p = c;
		if (bad) return -1;
		if (!c) return 0;
	}
}

/* hpvc.binds=BASE64 of "TAG PATH" lines: mount virtiofs TAG on PATH, nosuid,nodev.
 * The host's virtiofsd serves TAG with the job's user's rights (hpvc.host.virtiofsd),
 * so this guest's root sees under PATH what that user may see, no more. */
static int mount_binds(void)
{
	static char b64[2048], text[1600];
	int found = cmdline_get("hpvc.binds", b64, sizeof b64);
	if (found <= 0)
		return found < 0 ? fail("hpvc.binds= is too long") : 0;
	long n = b64_decode(b64, (unsigned char *)text, sizeof text - 1);
	if (n <= 0)
		return fail("hpvc.binds=: not base64");
	text[n] = '\0';
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *path = strchr(line, ' ');
		if (!path || path[1] != '/') {
			fail("hpvc.binds=: bad line %.80s", line);
			continue;
		}
		*path++ = '\0';
		if (make_dirs(path) != 0)
			fail("mkdir %s: %s", path, strerror(errno));
		else if (mount(line, path, "virtiofs", MS_NOSUID | MS_NODEV, NULL) != 0)
			fail("mount virtiofs %s on %s: %s", line, path, strerror(errno));
	}
	return 0;
}

static pid_t spawn(char *const argv[])
{
	static char *const env[] = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
				     "HOME=/root", "LANG=C.UTF-8", NULL };
	sigset_t none;
	pid_t pid = fork();
	if (pid < 0) fail("fork %s: %s", argv[0], strerror(errno));
	if (pid != 0) return pid;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	setsid();
	execve(argv[0], argv, env);
	fail("exec %s: %s", argv[0], strerror(errno));
	_exit(127);
}

/* sshd -D -e with an ed25519 host key made on the node's first boot (the base disk has
 * none: nodes never share one; not ssh-keygen -A, whose RSA key takes 6-14 s under TCG).
 * 0 when the image has no sshd: not a failure, the agent is then the way in. */
static pid_t start_sshd(void)
{
	static char *const keygen[] = { "/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "",
					"-f", HOST_KEY, NULL };
	static char *const sshd[] = { SSHD, "-D", "-e", "-o", "HostKey=" HOST_KEY, NULL };
	int status = -1;
	if (access(SSHD, X_OK) != 0) {
		dprintf(STDERR_FILENO, "hpvc-init: no " SSHD " in the image: commands reach this node"
				       " through its agent only\n");
		return 0;
	}
	if (access(HOST_KEY, F_OK) != 0) {
		pid_t pid = spawn(keygen);
		if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
			return fail("ssh-keygen " HOST_KEY " failed (wait status %d)", status);
		sync();
	}
	if (mkdir("/run/sshd", 0755) != 0 && errno != EEXIST)
		fail("mkdir /run/sshd: %s", strerror(errno));
	return spawn(sshd);
}

static int sshd_accepts(void)
{
	struct sockaddr_in sin = INET_ADDRESS(htonl(INADDR_LOOPBACK), 22);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int ok = fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0;
	if (fd >= 0) close(fd);
	return ok;
}

static void shut_down(void)
{
	pid_t pid = 0;
	kill(-1, SIGTERM);
	for (int waited = 0; waited < 2000 && !(pid < 0 && errno == ECHILD); waited += TICK_MS) {
		while ((pid = waitpid(-1, NULL, WNOHANG)) > 0)
			;
		usleep(TICK_MS * 1000);
	}
	kill(-1, SIGKILL);
	sync();
	mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY, NULL);
	sync();
	reboot(RB_POWER_OFF);
}

/* Wait for sshd (none: 0, the agent already listens), announce the outcome once,
 * then reap zombies until told to stop. */
static void serve(const char *name, pid_t sshd, const sigset_t *signals)
{
	struct timespec tick = { 0, TICK_MS * 1000000L };
	int waited = 0, announced = 0, status;
	for (;;) {
		int sig = sigtimedwait(signals, NULL, announced ? NULL : &tick);
		if (sig == SIGTERM || sig == SIGPWR) shut_down();
		for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;)
			if (pid == sshd) sshd = fail("sshd exited (wait status %d)", status);
		if (announced) continue;
		int up = sshd == 0 || (sshd > 0 && sshd_accepts());
		if (!up && sshd > 0 && (waited += TICK_MS) < SSHD_WAIT_MS) continue;
		if (!up) fail("sshd does not accept connections on 127.0.0.1:22");
		dprintf(STDOUT_FILENO, "%s %s\n", failed ? "hpvc-failed" : "hpvc-ready", name);
		announced = 1;
	}
}

/* A handler, so that PID 1 is not immune to these signals; sigtimedwait takes them. */
static void on_signal(int sig) { (void)sig; }

static int guest_main(void)
{
	static const int handled[] = { SIGTERM, SIGPWR, SIGCHLD };
	char name[64] = "";
	sigset_t signals;
	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&signals);
	for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++) {
		sigaddset(&signals, handled[i]);
		sigaction(handled[i], &sa, NULL);
	}
	sigprocmask(SIG_BLOCK, &signals, NULL);
	mount_api_filesystems();
	if (cmdline_get("hpvc.name", name, sizeof name) <= 0 || !name[0])
		fail("hpvc.name= is missing or too long");
	else if (sethostname(name, strlen(name)) != 0)
		fail("sethostname %s: %s", name, strerror(errno));
	configure_network();
	expose_ivshmem();
	install_peers();
	install_key();
	mount_binds();
	start_agent();
	serve(name[0] ? name : "(unnamed)", start_sshd(), &signals);
	return 0;
}

int main(int argc, char **argv)
{
	const char *role = argc > 0 ? strrchr(argv[0], '/') : NULL;
	role = role ? role + 1 : (argc > 0 ? argv[0] : "");
	if (getpid() != 1) {
		fprintf(stderr, "hpvc-init: must run as PID 1 of an hpvc guest\n");
		return 2;
	}
	return strcmp(role, "init") == 0 ? initramfs_main() : guest_main();
}
