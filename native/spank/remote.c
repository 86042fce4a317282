/* slurmstepd (remote context, user_init: once per step on each host, after the
 * step's I/O is connected, so errors reach the user's terminal):
 * `hpvc node up`, run as root, brings this host's share of the job's virtual
 * cluster up (or finds it running) and prints how each local task joins its node. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <slurm/slurm.h>

#include "hpvc_spank.h"

struct hpvc_join hpvc_joins[HPVC_MAX_TASKS];

void hpvc_free_joins(void)
{
	for (int t = 0; t < HPVC_MAX_TASKS; t++) {
		for (int i = 0; i < hpvc_joins[t].ncgroups; i++)
			free(hpvc_joins[t].cgroups[i]);
		for (int i = 0; i < hpvc_joins[t].nenv; i++)
			free(hpvc_joins[t].env[i]);
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
 * FILE", "env S K=V" for node
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

/* This host's name (the step's node list at this node's id in the step: an
 * srun inside a batch script inherits the batch host's SLURMD_NODENAME, so
 * that variable cannot be trusted here), then its place in the job's list
 * job_nodes (SLURM_JOB_NODELIST, as Slurm writes it: n[1-3]). */
static int job_index(spank_t sp, uint32_t nodeid, char *job_nodes, size_t size, int *index,
		     int *hosts)
{
	char step_nodes[8192], name[256] = "";
	if (spank_getenv(sp, "SLURM_JOB_NODELIST", job_nodes, (int)size) != ESPANK_SUCCESS ||
	    spank_getenv(sp, "SLURM_STEP_NODELIST", step_nodes, sizeof(step_nodes)) != ESPANK_SUCCESS) {
		slurm_error("hpvc: the step has no SLURM_JOB_NODELIST or SLURM_STEP_NODELIST");
		return -1;
	}
	hostlist_t hl = slurm_hostlist_create(step_nodes);
	char *h = NULL;
	for (uint32_t i = 0; hl && i <= nodeid; i++) {
		free(h);
		h = slurm_hostlist_shift(hl);
	}
	if (h != NULL)
		snprintf(name, sizeof(name), "%s", h);
	free(h);
	if (hl)
		slurm_hostlist_destroy(hl);
	hl = slurm_hostlist_create(job_nodes);
	if (hl == NULL)
		return -1;
	*hosts = slurm_hostlist_count(hl);
	*index = name[0] ? slurm_hostlist_find(hl, name) : -1;
	slurm_hostlist_destroy(hl);
	if (*index < 0) {
		slurm_error("hpvc: node '%s' is not in the job's node list %s", name, job_nodes);
		return -1;
	}
	return 0;
}

int hpvc_slots;

/* Parse join records; slots must be 0..n-1 without holes. Frees text.
 * quiet: say nothing on failure (a cache from an older hpvc: ask hpvc). */
static int use_joins(char *text, const char *from, int quiet)
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
static int joins_alive(void)
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
static char *read_cache(const struct hpvc_config *cfg, uint32_t job, int index, const char *mpi)
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

int hpvc_remote_user_init(spank_t sp, const struct hpvc_config *cfg)
{
	uint32_t job = 0, step = 0, nodeid = 0;
	if (hpvc_spec_arg == NULL)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NODEID, &nodeid) != ESPANK_SUCCESS) {
		slurm_error("hpvc: cannot read the step's job id, step id or node id");
		return -1;
	}
	/* The batch script, the extern and the interactive step stay on the host:
	 * they must reach slurmctld and run srun. Steps run in the virtual nodes. */
	if (step >= SLURM_INTERACTIVE_STEP)
		return 0;
	/* A spec is at most 64 KiB (hpvc node check), 88 KiB in base64. */
	static char spec[96 * 1024];
	memcpy(spec, HPVC_SPEC_ENV "=", sizeof(HPVC_SPEC_ENV));
	char *value = spec + sizeof(HPVC_SPEC_ENV);
	spank_err_t got = spank_getenv(sp, HPVC_SPEC_ENV, value, sizeof(spec) - sizeof(HPVC_SPEC_ENV));
	if (got == ESPANK_NOSPACE) {
		slurm_error("hpvc: the job's %s is too long (a spec is at most 64 KiB)", HPVC_SPEC_ENV);
		return -1;
	}
	if (got != ESPANK_SUCCESS) {
		slurm_error("hpvc: the job's environment has no %s (was it submitted with --export=NONE?)",
			    HPVC_SPEC_ENV);
		return -1;
	}
	int index = 0, hosts = 0;
	static char job_nodes[8192];
	if (job_index(sp, nodeid, job_nodes, sizeof(job_nodes), &index, &hosts) < 0)
		return -1;
	char *cores = NULL, mpi[64] = "";
	if (spank_get_item(sp, S_JOB_ALLOC_CORES, &cores) != ESPANK_SUCCESS)
		cores = NULL;
	if (spank_getenv(sp, "SLURM_MPI_TYPE", mpi, sizeof(mpi)) != ESPANK_SUCCESS)
		mpi[0] = '\0';

	/* The cache only saves starting hpvc: anything odd about it (an older
	 * format, a node process that is gone or not the same) means asking
	 * `hpvc node up`, which checks the share and writes the cache anew. */
	char *cached = read_cache(cfg, job, index, mpi);
	if (cached != NULL && use_joins(cached, "the running share", 1) == 0 && joins_alive())
		return 0;
	hpvc_free_joins();
	hpvc_slots = 0;

	/* The job's memory on this host (MB), for hpvc to refuse a share that
	 * does not fit in it before it changes anything. */
	uint64_t mem = 0;
	if (spank_get_item(sp, S_JOB_ALLOC_MEM, &mem) != ESPANK_SUCCESS)
		mem = 0;

	char sjob[16], sindex[16], shosts[16], smem[32], state[4200], images[4200];
	snprintf(sjob, sizeof(sjob), "%u", job);
	snprintf(sindex, sizeof(sindex), "%d", index);
	snprintf(shosts, sizeof(shosts), "%d", hosts);
	char *argv[24 + 2 * HPVC_MAX_SITE];
	int k = 0;
	argv[k++] = (char *)cfg->hpvc;
	argv[k++] = "node";
	argv[k++] = "up";
	argv[k++] = "--job";
	argv[k++] = sjob;
	argv[k++] = "--index";
	argv[k++] = sindex;
	argv[k++] = "--hosts";
	argv[k++] = shosts;
	if (cores && cores[0]) {
		argv[k++] = "--cpus";
		argv[k++] = cores;
	}
	if (mpi[0]) {
		argv[k++] = "--mpi";
		argv[k++] = mpi;
	}
	if (mem > 0 && mem < INT64_MAX) {
		snprintf(smem, sizeof(smem), "%llu", (unsigned long long)mem);
		argv[k++] = "--mem-mib";
		argv[k++] = smem;
	}
	/* The job's hosts, for wiring this host's share to the others'. */
	if (job_nodes[0]) {
		argv[k++] = "--nodelist";
		argv[k++] = job_nodes;
	}
	for (int i = 0; i < cfg->nsite; i++) {
		argv[k++] = "--site";
		argv[k++] = cfg->site[i];
	}
	argv[k] = NULL;
	char *env[HPVC_ROOT_ENV];
	hpvc_root_env(cfg, state, sizeof(state), images, sizeof(images), spec, env);
	char *out = NULL;
	double t0 = hpvc_now();
	int rc = hpvc_run(argv, env, cfg->timeout, 1, &out);
	double took = hpvc_now() - t0;
	if (rc != 0) {
		free(out);
		slurm_error("hpvc: job %u: the virtual nodes of host %d did not come up", job, index);
		return -1;
	}
	if (use_joins(out, "`hpvc node up`", 0) < 0)
		return -1;
	/* How long `hpvc node up` took, start to exit, for the step's tasks
	 * (hpvc bench slurm breaks the first step down by it); not cached. */
	char timed[64];
	snprintf(timed, sizeof(timed), "HPVC_NODE_UP_S=%.3f", took);
	for (int t = 0; t < hpvc_slots; t++) {
		char *kv = hpvc_joins[t].nenv < HPVC_MAX_ENV ? strdup(timed) : NULL;
		if (kv != NULL)
			hpvc_joins[t].env[hpvc_joins[t].nenv++] = kv;
	}
	return 0;
}
