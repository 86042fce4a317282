/* Join records: how each local task of a step joins its virtual node.
 *
 * `hpvc node up` prints them (remote.c runs it) and keeps them in a cache in
 * its state directory; slurmstepd reads that cache instead of starting hpvc
 * again when the share is already running. task.c and vm.c read the parsed
 * records (hpvc_joins, hpvc_slots). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hpvc_spank.h"

struct hpvc_join hpvc_joins[HPVC_MAX_TASKS];

void hpvc_free_joins(void)
{
	for (int t = 0; t < HPVC_MAX_TASKS; t++) {
		for (int i = 0; i < hpvc_joins[t].ncgroups; i++)
			free(hpvc_joins[t].cgroups[i]);
		for (int i = 0; i < hpvc_joins[t].nenv; i++)
			free(hpvc_joins[t].env[i]);
		free(hpvc_joins[t].key);
		free(hpvc_joins[t].workdir);
		memset(&hpvc_joins[t], 0, sizeof(hpvc_joins[t]));
	}
}

static int parse_slot(const char *s, char **rest)
{
	errno = 0;
	long t = strtol(s, rest, 10);
	if (errno != 0 || *rest == s || **rest != ' ' || t < 0 || t >= HPVC_MAX_TASKS)
		return -1;
	(*rest)++;
	return (int)t;
}

/* The namespaces a task may be told to join, as setns() flags. */
static int ns_flags(const char *list)
{
	static const struct {
		const char *name;
		int flag;
	} known[] = {
		{ "cgroup", CLONE_NEWCGROUP }, { "ipc", CLONE_NEWIPC }, { "uts", CLONE_NEWUTS },
		{ "net", CLONE_NEWNET },       { "pid", CLONE_NEWPID }, { "mnt", CLONE_NEWNS },
	};
	int flags = 0;
	for (const char *p = list; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		int found = 0;
		for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
			if (strlen(known[i].name) == len && strncmp(p, known[i].name, len) == 0) {
				flags |= known[i].flag;
				found = 1;
			}
		if (!found)
			return -1;
		p = end ? end + 1 : p + len;
	}
	return flags;
}

int hpvc_proc_start(pid_t pid, unsigned long long *start)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	/* "PID (COMM) STATE ...": COMM may hold spaces and parentheses; the
	 * fields after its last ')' are numbered from 3. */
	char *p = strrchr(buf, ')');
	if (p == NULL)
		return -1;
	p++;
	for (int field = 3; field <= 22; field++) {
		while (*p == ' ')
			p++;
		if (*p == '\0')
			return -1;
		if (field == 22) {
			char *end = NULL;
			errno = 0;
			unsigned long long v = strtoull(p, &end, 10);
			if (errno != 0 || end == p || (*end != ' ' && *end != '\0' && *end != '\n'))
				return -1;
			*start = v;
			return 0;
		}
		while (*p != ' ' && *p != '\0')
			p++;
	}
	return -1;
}

/* Lines: "node S PID START NS NAME" (a container node: namespaces to join) or
 * "vm S PID START IP NAME" (a VM: its QEMU and its agent's address), "cgroup S
 * FILE", "env S K=V", "agentkey S FILE" (a VM: the root-only file of its
 * agent's key), "cwd S DIR" (an imported image's WorkingDir) for node
 * slot S (local task t runs in slot t mod the number of slots); START is the
 * node process's start time (field 22 of /proc/PID/stat), so that a PID the
 * kernel gave to another process since is never taken for the node's.
 * Anything else is an error. */
int hpvc_parse_joins(const char *text)
{
	char *copy = strdup(text), *save = NULL, *rest;
	if (copy == NULL)
		return -1;
	int rc = 0;
	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		int vm = strncmp(line, "vm ", 3) == 0;
		if (vm || strncmp(line, "node ", 5) == 0) {
			/* "node S PID START NS NAME" (a container: the namespaces to
			 * join) or "vm S PID START IP NAME" (its QEMU, and the address
			 * of its agent on the cluster network). */
			int t = parse_slot(line + (vm ? 3 : 5), &rest);
			long pid;
			unsigned long long start;
			char where[128], node[64], more;
			if (t < 0 || hpvc_joins[t].used ||
			    sscanf(rest, "%ld %llu %127s %63s %c", &pid, &start, where, node, &more) != 4 ||
			    pid <= 1 || pid > INT32_MAX || start == 0 ||
			    (vm ? strlen(where) >= sizeof(hpvc_joins[t].ip)
				: (hpvc_joins[t].nsflags = ns_flags(where)) <= 0)) {
				rc = -1;
				break;
			}
			hpvc_joins[t].used = 1;
			hpvc_joins[t].vm = vm;
			hpvc_joins[t].pid = (pid_t)pid;
			hpvc_joins[t].start = start;
			strcpy(vm ? hpvc_joins[t].ip : hpvc_joins[t].ns, where);
			strcpy(hpvc_joins[t].node, node);
		} else if (strncmp(line, "cgroup ", 7) == 0) {
			int t = parse_slot(line + 7, &rest);
			if (t < 0 || rest[0] != '/' || hpvc_joins[t].ncgroups >= HPVC_MAX_CGROUPS) {
				rc = -1;
				break;
			}
			hpvc_joins[t].cgroups[hpvc_joins[t].ncgroups++] = strdup(rest);
		} else if (strncmp(line, "agentkey ", 9) == 0) {
			int t = parse_slot(line + 9, &rest);
			if (t < 0 || rest[0] != '/' || hpvc_joins[t].key != NULL) {
				rc = -1;
				break;
			}
			hpvc_joins[t].key = strdup(rest);
		} else if (strncmp(line, "cwd ", 4) == 0) {
			int t = parse_slot(line + 4, &rest);
			if (t < 0 || rest[0] != '/' || hpvc_joins[t].workdir != NULL) {
				rc = -1;
				break;
			}
			hpvc_joins[t].workdir = strdup(rest);
		} else if (strncmp(line, "env ", 4) == 0) {
			int t = parse_slot(line + 4, &rest);
			if (t < 0 || strchr(rest, '=') == NULL || hpvc_joins[t].nenv >= HPVC_MAX_ENV) {
				rc = -1;
				break;
			}
			hpvc_joins[t].env[hpvc_joins[t].nenv++] = strdup(rest);
		} else if (line[0] != '\0') {
			rc = -1;
			break;
		}
	}
	free(copy);
	return rc;
}

int hpvc_slots;

/* Parse join records; slots must be 0..n-1 without holes. Frees text.
 * quiet: say nothing on failure (a cache from an older hpvc: ask hpvc). */
int hpvc_use_joins(char *text, const char *from, int quiet)
{
	hpvc_free_joins();
	int rc = hpvc_parse_joins(text);
	free(text);
	hpvc_slots = 0;
	while (hpvc_slots < HPVC_MAX_TASKS && hpvc_joins[hpvc_slots].used)
		hpvc_slots++;
	for (int t = hpvc_slots; rc == 0 && t < HPVC_MAX_TASKS; t++)
		if (hpvc_joins[t].used)
			rc = -1;
	if (rc < 0 || hpvc_slots == 0) {
		if (!quiet)
			slurm_error("hpvc: cannot understand the node records of %s", from);
		hpvc_free_joins();
		hpvc_slots = 0;
		return -1;
	}
	return 0;
}

/* Is every node's process still the one the records name (same PID, same
 * start time)? A node that was stopped, or whose PID went to another
 * process, makes the cache worthless. */
int hpvc_joins_alive(void)
{
	for (int t = 0; t < hpvc_slots; t++) {
		unsigned long long start = 0;
		if (hpvc_proc_start(hpvc_joins[t].pid, &start) < 0 || start != hpvc_joins[t].start)
			return 0;
	}
	return 1;
}

/* In a child that takes root back (user_init runs with the user's effective
 * ids and root's saved ones; the records live in root's 0700 state): open the
 * cache, check it, copy it to fd `out`. Exits 0 when it copied all of it. */
static void cache_child(const char *path, int out)
{
	if (geteuid() != 0 && setresuid(0, 0, 0) < 0)
		_exit(1);
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & 022) || st.st_size <= 0 || st.st_size >= (1 << 20))
		_exit(1);
	static char buf[1 << 16];
	off_t left = st.st_size;
	while (left > 0) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n <= 0)
			_exit(1);
		for (ssize_t w = 0; w < n;) {
			ssize_t k = write(out, buf + w, (size_t)(n - w));
			if (k <= 0)
				_exit(1);
			w += k;
		}
		left -= n;
	}
	_exit(0);
}

/* A running share's join records, written by `hpvc node up` as root: read
 * them instead of starting hpvc again (no Python, no exec: a fork that reads
 * one file as root). Only a regular root-owned file that no one else may
 * write is trusted; anything else means "ask hpvc". */
char *hpvc_read_join_cache(const struct hpvc_config *cfg, uint32_t job, int index, const char *mpi)
{
	for (const char *p = mpi; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		      *p == '_'))
			return NULL;
	char path[4300];
	snprintf(path, sizeof(path), "%s/jobs/j%u-%d.%s.join", cfg->state_dir, job, index,
		 mpi[0] ? mpi : "none");
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return NULL;
	pid_t pid = fork();
	if (pid < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return NULL;
	}
	if (pid == 0) {
		close(pfd[0]);
		cache_child(path, pfd[1]);
	}
	close(pfd[1]);
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	while (buf != NULL) {
		if (len + 1 >= cap) {
			char *bigger = cap < (1 << 20) ? realloc(buf, cap * 2) : NULL;
			if (bigger == NULL) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = bigger;
			cap *= 2;
		}
		ssize_t n = read(pfd[0], buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(pfd[0]);
	int status = 0;
	pid_t w;
	while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
		;
	if (buf == NULL || w != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || len == 0) {
		free(buf);
		return NULL;
	}
	buf[len] = '\0';
	return buf;
}
