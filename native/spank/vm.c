/* Tasks in virtual machines (remote context): the task process itself becomes
 * the relay to its node's agent (native/agent), and never execs the program on
 * the host.
 *
 *   task_init_privileged (root, before slurmstepd changes to the user):
 *       connect to the node's agent from a reserved port (root only: the agent
 *       trusts nothing else); the socket is kept for the next hook.
 *   task_init (the user's ids, the task's stdio in place):
 *       send argv, the task's environment (filtered: what a task needs, none of
 *       the host's secrets) and working directory, then relay stdin, stdout,
 *       stderr and signals until the command ends, and exit as it did.
 *
 * slurmstepd signals the task (srun's Ctrl-C, scancel, the time limit): the
 * relay passes the signal to the command's process group in the guest. When
 * slurmstepd SIGKILLs the relay, or itself dies (the parent-death signal),
 * the connection closes and the agent SIGKILLs the command. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "../agent/agent.h"
#include "hpvc_spank.h"

/* A quarter of the pool (512-1023): four users' full share fill it. */
#define HPVC_RELAY_PORTS_PER_USER 128

static int vm_sock = -1;
static char vm_node[64];
static const struct hpvc_join *vm_join; /* the node's record (its image's Env, WorkingDir) */

/* How many TCP connections to a guest's agent from a reserved port (the
 * pool 512-1023 hpvc_agent_connect takes from) the host's /proc/net/tcp
 * gives to uid: the relays make their sockets with the task's user as owner
 * (below), so each user's count is theirs; -1 if unreadable. */
static int relay_ports_held(uid_t uid)
{
	FILE *f = fopen("/proc/net/tcp", "re");
	if (f == NULL)
		return -1;
	char line[512];
	int n = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned lport = 0, rport = 0, state = 0;
		unsigned long owner = 0;
		if (sscanf(line, " %*u: %*x:%x %*x:%x %x %*x:%*x %*x:%*x %*x %lu", &lport, &rport,
			   &state, &owner) == 4 &&
		    lport >= 512 && lport < 1024 && rport == HPVC_AGENT_PORT && owner == uid)
			n++;
	}
	fclose(f);
	return n;
}

/* The agent's second fence: prove the relay holds the job's key (read as
 * root from the file `hpvc node up` named; it never leaves this host). */
static int login(int fd, const struct hpvc_join *j)
{
	unsigned char key[HPVC_AGENT_KEY_MAX];
	int klen = j->key ? hpvc_agent_read_key(j->key, key) : -1;
	if (klen < 0) {
		close(fd);
		slurm_error("hpvc: node %s: cannot read its agent key %s: %s", j->node,
			    j->key ? j->key : "(none given by hpvc node up)",
			    j->key ? strerror(errno) : "start the step again");
		return -1;
	}
	const char *why = "";
	int rc = hpvc_agent_login(fd, key, (size_t)klen, &why);
	memset(key, 0, sizeof(key));
	if (rc < 0) {
		close(fd);
		slurm_error("hpvc: node %s (%s): %s", j->node, j->ip, why);
		return -1;
	}
	vm_sock = fd;
	vm_join = j;
	snprintf(vm_node, sizeof(vm_node), "%s", j->node);
	return 0;
}

/* From a reserved port, as root (the agent's fence). The socket is made with
 * the task's user as its file-system uid, which owns it in /proc/net/tcp:
 * one user's tasks on a host hold at most HPVC_RELAY_PORTS_PER_USER of the
 * pool every VM job there shares, so no user exhausts it for the others. */
int hpvc_vm_connect(spank_t sp, const struct hpvc_join *j)
{
	uid_t uid = 0;
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
		slurm_error("hpvc: node %s: cannot read the job's user", j->node);
		return -1;
	}
	int was = setfsuid(uid);
	int fd = hpvc_agent_connect(j->ip, HPVC_AGENT_PORT), err = errno;
	setfsuid((uid_t)was);
	if (fd < 0) {
		slurm_error("hpvc: node %s (%s): cannot reach its agent: %s; is the VM still running?",
			    j->node, j->ip, strerror(err));
		return -1;
	}
	int held = relay_ports_held(uid);
	if (held < 0) {
		close(fd);
		slurm_error("hpvc: node %s: cannot read /proc/net/tcp to count the user's task relays",
			    j->node);
		return -1;
	}
	if (held > HPVC_RELAY_PORTS_PER_USER) {
		close(fd);
		slurm_error("hpvc: node %s: user %u already holds %d task relays to VM nodes on this host, the most one user may (%d of the 512 reserved ports every job here shares); wait for tasks to end or run fewer tasks per host",
			    j->node, (unsigned)uid, held - 1, HPVC_RELAY_PORTS_PER_USER);
		return -1;
	}
	return login(fd, j);
}

/* What of the task's environment goes into the guest: Slurm's task variables,
 * MPI and OpenMP settings, hpvc's (not the spec) and the locale. Everything
 * else (PATH, HOME, agents' sockets, credentials caches) is the host's. */
static int passed(const char *kv)
{
	static const char *const prefixes[] = { "SLURM_", "OMPI_", "OMP_", "MPICH_", "UCX_",
						"HPVC_", "LC_", "PMIX_", "PMI_" };
	static const char *const names[] = { "LANG", "TERM", "TZ" };
	if (strncmp(kv, HPVC_SPEC_ENV "=", sizeof(HPVC_SPEC_ENV)) == 0 ||
	    strncmp(kv, HPVC_SPEC_PATH_ENV "=", sizeof(HPVC_SPEC_PATH_ENV)) == 0)
		return 0;
	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
		if (strncmp(kv, prefixes[i], strlen(prefixes[i])) == 0)
			return 1;
	size_t k = strcspn(kv, "=");
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i]) == k && strncmp(kv, names[i], k) == 0)
			return 1;
	return 0;
}

/* What an exec would have closed: slurmstepd's descriptors marked
 * close-on-exec, among them the other ends of the task's stdio pipes (the
 * relay would never see the end of its input while it holds the writer). */
static void close_on_exec_fds(int keep)
{
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return;
	int self = dirfd(d);
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char *end = NULL;
		long fd = strtol(e->d_name, &end, 10);
		if (end == e->d_name || *end != '\0' || fd <= 2 || fd == keep || fd == self)
			continue;
		int flags = fcntl((int)fd, F_GETFD);
		if (flags >= 0 && (flags & FD_CLOEXEC))
			close((int)fd);
	}
	closedir(d);
}

/* `srun --pty`: slurmstepd gave task 0 a pty as stdin, stdout and stderr.
 * The command gets a pty in the guest (agent.h, 't'); the relay's own goes
 * raw while it runs (native/agent/tty.c), so Ctrl-C and Ctrl-Z reach the
 * guest's line discipline as bytes rather than this relay as signals, and
 * its window size follows srun's (slurmstepd sets it on the pty). */
static int vm_task_tty(char **argv, char **env, const char *dir)
{
	const char *term = NULL, *why = "";
	for (int i = 0; env[i]; i++)
		if (strncmp(env[i], "TERM=", 5) == 0)
			term = env[i] + 5;
	int rc = hpvc_agent_run_tty(vm_sock, argv, env, dir, vm_join ? vm_join->workdir : NULL,
				    STDIN_FILENO, term, &why);
	if (rc == -256)
		slurm_error("hpvc: node %s: %s", vm_node, why);
	return rc;
}

int hpvc_vm_task(spank_t sp)
{
	if (vm_sock < 0)
		return 0;
	close_on_exec_fds(vm_sock);
	/* slurmstepd gone: the relay goes too (set after the change of ids,
	 * which clears it). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* Not "slurmstepd": proctrack/linuxproc signals only the step's processes
	 * whose name differs from its own (scancel, the time limit). */
	prctl(PR_SET_NAME, "hpvc-vmrelay", 0, 0, 0);
	int argc = 0;
	char **argv = NULL, **env = NULL;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1) {
		slurm_error("hpvc: node %s: the task has no command", vm_node);
		_exit(1);
	}
	if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS)
		env = NULL;
	int n = 0;
	while (env && env[n])
		n++;
	char **keep = calloc((size_t)n + HPVC_MAX_ENV + 1, sizeof(char *));
	if (keep == NULL)
		_exit(1);
	int k = 0;
	for (int i = 0; i < n; i++)
		if (passed(env[i]))
			keep[k++] = env[i];
	/* What hpvc node up gave the node (its image's Env, hpvc's variables):
	 * task_init_privileged put it into the task's environment, under Slurm's
	 * task variables, so what the filter passes is there already; the rest
	 * (the image's PATH, its own names) goes as the record has it. */
	for (int i = 0; vm_join && i < vm_join->nenv; i++) {
		char *kv = vm_join->env[i];
		if (passed(kv))
			continue;
		size_t len = strcspn(kv, "=");
		int at = k;
		for (int m = 0; m < k; m++)
			if (strncmp(keep[m], kv, len) == 0 && keep[m][len] == '=')
				at = m; /* the image named it twice: the last one */
		keep[at] = kv;
		k += at == k;
	}
	/* The job's directory if the guest has it, else the image's WorkingDir. */
	char cwd[PATH_MAX];
	const char *dir = getcwd(cwd, sizeof(cwd)) ? cwd : NULL;
	const char *why = "";
	/* Slurm's PMIx server or PMI-2 stream, carried beside the command
	 * (native/agent/chan.c): this relay is their peer on the host. */
	if (hpvc_chan_host_setup(env, &why) < 0) {
		slurm_error("hpvc: node %s: --mpi: %s", vm_node, why);
		_exit(1);
	}
	int rc = isatty(STDIN_FILENO) ? vm_task_tty(argv, keep, dir)
				      : hpvc_agent_run(vm_sock, argv, keep, dir,
						       vm_join ? vm_join->workdir : NULL, STDIN_FILENO,
						       &why);
	if (rc == -256) {
		slurm_error("hpvc: node %s: %s", vm_node, why);
		_exit(255);
	}
	if (rc >= 0)
		_exit(rc);
	/* Killed by a signal in the guest: so is the task, for srun to report. */
	int sig = -rc;
	signal(sig, SIG_DFL);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, sig);
	sigprocmask(SIG_UNBLOCK, &set, NULL);
	raise(sig);
	_exit(128 + sig);
}
