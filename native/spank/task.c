/* Each task (remote context, task_init_privileged: forked by slurmstepd, still
 * root, before it execs the user's program) moves into its virtual node (a VM
 * node instead connects to its agent: vm.c): the
 * node's cgroups, then its cgroup, IPC, UTS, network (also under --mpi=pmix:
 * pmixfwd.c brings Slurm's PMIx server into the node), PID and mount
 * namespaces, as `hpvc node up` said.
 *
 * The node is entered through a pidfd of its process, taken after checking
 * that the PID still belongs to the process `hpvc node up` named (same start
 * time): a PID the kernel has given to another process since is never
 * entered. Before it goes back to slurmstepd (which then takes the user's
 * ids and execs the program) the task gives up every way back to privilege:
 * no_new_privs, and an empty capability bounding set, so a setuid or
 * file-capability binary inside the node cannot make the user root.
 *
 * A PID namespace only applies to children, so the task forks once more: the
 * child (PID inside the node) goes on to exec the program; this process stays
 * as a small relay (root, named hpvc-relay) that forwards signals, exits as
 * the child did, and SIGKILLs the child if slurmstepd dies first (the child's
 * own parent-death signal does not survive its change to the user's ids). The
 * relay keeps no descriptor above stderr: it must not hold the writer of the
 * program's stdin pipe (then the program never sees its end of input). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hpvc_spank.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture */
#endif

/* The relay's parent-death signal: one of its own, never forwarded. */
#define PARENT_GONE (SIGRTMIN + 3)

/* Where the task starts when its node lacks the job's directory: the image's
 * WorkingDir (set in task_init_privileged; after it Slurm makes its own chdir,
 * to the job's directory or else /tmp, so task_init comes back here). */
static const char *start_dir;

static volatile sig_atomic_t child_pid;
static volatile sig_atomic_t stepd_pgid; /* slurmstepd's own group: never killed */

static void forward(int sig)
{
	if (child_pid > 0)
		kill((pid_t)child_pid, sig);
}

/* slurmstepd died: nothing will signal or reap the step any more. Kill the
 * program, then the rest of the step's process group (slurmstepd puts the
 * step's tasks on this host in one: the other tasks and their relays, this
 * one included), unless slurmstepd died before it moved us there. */
static void parent_gone(int sig)
{
	(void)sig;
	if (child_pid > 0)
		kill((pid_t)child_pid, SIGKILL);
	pid_t group = getpgrp();
	if (group > 1 && group != (pid_t)stepd_pgid)
		kill(0, SIGKILL);
	_exit(128 + SIGKILL);
}

static int join_cgroups(const struct hpvc_join *j)
{
	char pid[32];
	int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	for (int i = 0; i < j->ncgroups; i++) {
		int fd = open(j->cgroups[i], O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, pid, (size_t)len) != len) {
			slurm_error("hpvc: cannot join cgroup %s: %s", j->cgroups[i], strerror(errno));
			if (fd >= 0)
				close(fd);
			return -1;
		}
		close(fd);
	}
	return 0;
}

/* The highest capability this kernel knows (read from the host's /proc,
 * before entering the node's mount namespace). */
static int last_cap(void)
{
	char buf[16] = "";
	int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n > 0) {
			buf[n] = '\0';
			char *end = NULL;
			long v = strtol(buf, &end, 10);
			if (end != buf && v >= 0 && v < 64)
				return (int)v;
		}
	}
	/* No /proc: ask the kernel, which refuses capabilities it does not know. */
	int cap = 0;
	while (cap < 63 && prctl(PR_CAPBSET_READ, cap + 1, 0, 0, 0) >= 0)
		cap++;
	return cap;
}

/* no_new_privs and an empty bounding set: from now on execve can only keep
 * or lose privilege. slurmstepd's own setgroups/setgid/setuid after this hook
 * use the effective capabilities, which stay until it changes to the user. */
static int harden(const struct hpvc_join *j, int cap_max)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		slurm_error("hpvc: node %s: cannot set no_new_privs: %s", j->node, strerror(errno));
		return -1;
	}
	for (int cap = 0; cap <= cap_max; cap++) {
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) {
			slurm_error("hpvc: node %s: cannot drop capability %d from the bounding set: %s",
				    j->node, cap, strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* The node's extra environment (hpvc node up's "env" records) into the task's. */
static void set_env(spank_t sp, const struct hpvc_join *j)
{
	for (int i = 0; i < j->nenv; i++) {
		char *eq = strchr(j->env[i], '=');
		if (eq == NULL) /* hpvc_parse_joins only keeps K=V */
			continue;
		*eq = '\0';
		spank_setenv(sp, j->env[i], eq + 1, 1);
		*eq = '=';
	}
}

static void relay(pid_t child, pid_t stepd)
{
	/* The relay never execs, so nothing closes for it what slurmstepd marked
	 * close-on-exec: the write end of this task's stdin pipe (and of the
	 * other local tasks'), the other ends of their stdout and stderr,
	 * slurmstepd's own sockets and pipes. Held here, the program would never
	 * see the end of its input (`srun --input=all ... cat`) once slurmstepd
	 * closed its own copy. It needs none of them: it only waits and signals. */
	hpvc_close_above_stderr();
	int sigs[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGALRM };
	struct sigaction sa;
	sigset_t set;
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&set);
	sa.sa_handler = forward;
	child_pid = child;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		sigaction(sigs[i], &sa, NULL);
		sigaddset(&set, sigs[i]);
	}
	sa.sa_handler = parent_gone;
	sigaction(PARENT_GONE, &sa, NULL);
	sigaddset(&set, PARENT_GONE);
	sigprocmask(SIG_UNBLOCK, &set, NULL);
	prctl(PR_SET_NAME, "hpvc-relay", 0, 0, 0);
	/* The relay keeps root's ids, so this stays set (unlike the child's). */
	if (prctl(PR_SET_PDEATHSIG, PARENT_GONE) < 0 || getppid() != stepd)
		parent_gone(0);
	int status = 0;
	while (waitpid(child, &status, 0) < 0) {
		if (errno != EINTR)
			_exit(127);
	}
	hpvc_exit_as(status);
}

void hpvc_task_chdir(void)
{
	if (start_dir != NULL && chdir(start_dir) < 0)
		slurm_error("hpvc: cannot start in the image's WorkingDir %s: %s", start_dir,
			    strerror(errno));
}

int hpvc_task_join(spank_t sp)
{
	int task = -1;
	if (spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task < 0 || hpvc_slots <= 0) {
		slurm_error("hpvc: no virtual node for local task %d", task);
		return -1;
	}
	const struct hpvc_join *j = &hpvc_joins[task % hpvc_slots];
	/* A pidfd pins the process: once the start time matches after opening
	 * it, the pidfd is the node's process, whatever happens to the PID. */
	int pidfd = (int)syscall(SYS_pidfd_open, j->pid, 0);
	unsigned long long start = 0;
	if (pidfd < 0 || hpvc_proc_start(j->pid, &start) < 0 || start != j->start) {
		if (pidfd < 0 && errno != ESRCH)
			slurm_error("hpvc: node %s: cannot open its process %d: %s", j->node, (int)j->pid,
				    strerror(errno));
		else
			slurm_error("hpvc: node %s is not running (its process changed); start the step again, which brings it back, or cancel the job",
				    j->node);
		if (pidfd >= 0)
			close(pidfd);
		return -1;
	}
	if (j->vm) {
		/* The task runs in the guest: here it is only the relay. */
		close(pidfd);
		set_env(sp, j);
		if (hpvc_vm_connect(sp, j) < 0)
			return -1;
		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
			slurm_error("hpvc: node %s: cannot set no_new_privs: %s", j->node, strerror(errno));
			return -1;
		}
		return 0;
	}
	int cap_max = last_cap();
	if (join_cgroups(j) < 0) {
		close(pidfd);
		return -1;
	}
	char cwd[PATH_MAX];
	int have_cwd = getcwd(cwd, sizeof(cwd)) != NULL;
	/* All of the node's namespaces at once (Linux 5.8). */
	if (setns(pidfd, j->nsflags) < 0) {
		int err = errno;
		close(pidfd);
		if (err == ESRCH)
			slurm_error("hpvc: node %s is not running (its process changed); start the step again, which brings it back, or cancel the job",
				    j->node);
		else
			slurm_error("hpvc: node %s: cannot enter its namespaces (%s): %s", j->node, j->ns,
				    strerror(err));
		return -1;
	}
	close(pidfd);
	/* The job's directory if the node has it (a shared file system), else
	 * the image's WorkingDir (again in task_init: hpvc_task_chdir), else /. */
	if (!have_cwd || chdir(cwd) < 0) {
		start_dir = j->workdir;
		if ((j->workdir == NULL || chdir(j->workdir) < 0) && chdir("/") < 0)
			return -1;
	}
	set_env(sp, j);
	if (harden(j, cap_max) < 0)
		return -1;
	if (!(j->nsflags & CLONE_NEWPID))
		return 0;
	pid_t stepd = getppid();
	stepd_pgid = getpgid(stepd);
	pid_t child = fork();
	if (child < 0) {
		slurm_error("hpvc: fork into node %s: %s", j->node, strerror(errno));
		return -1;
	}
	if (child == 0) {
		/* Until slurmstepd changes to the user's ids, which clears it. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		return 0;
	}
	relay(child, stepd);
	return -1; /* not reached */
}
