/* Each task (remote context, task_init_privileged: forked by slurmstepd, still
 * root, before it execs the user's program) moves into its virtual node: the
 * node's cgroups, then its cgroup, IPC, UTS, network (unless Slurm's PMIx needs
 * the host's), PID and mount namespaces, as `hpvc node up` said.
 *
 * A PID namespace only applies to children, so the task forks once more: the
 * child (PID inside the node) goes on to exec the program; this process stays
 * as a small relay that forwards signals and exits as the child did. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "hpvc_spank.h"

static const struct {
	const char *name;
	int flag;
} ORDER[] = {
	/* mnt last: after it, /proc is the node's */
	{ "cgroup", CLONE_NEWCGROUP }, { "ipc", CLONE_NEWIPC }, { "uts", CLONE_NEWUTS },
	{ "net", CLONE_NEWNET },       { "pid", CLONE_NEWPID }, { "mnt", CLONE_NEWNS },
};
#define NNS (sizeof(ORDER) / sizeof(ORDER[0]))

static volatile sig_atomic_t child_pid;

static void forward(int sig)
{
	if (child_pid > 0)
		kill((pid_t)child_pid, sig);
}

static int wanted(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		p = end ? end + 1 : NULL;
	}
	return 0;
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

static void relay(pid_t child)
{
	int sigs[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGALRM };
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forward;
	child_pid = child;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, NULL);
	int status = 0;
	while (waitpid(child, &status, 0) < 0) {
		if (errno != EINTR)
			_exit(127);
	}
	if (WIFSIGNALED(status)) {
		int sig = WTERMSIG(status);
		signal(sig, SIG_DFL);
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, sig);
		sigprocmask(SIG_UNBLOCK, &set, NULL);
		raise(sig);
	}
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128);
}

int hpvc_task_join(spank_t sp)
{
	int task = -1;
	if (spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task < 0 || hpvc_slots <= 0) {
		slurm_error("hpvc: no virtual node for local task %d", task);
		return -1;
	}
	const struct hpvc_join *j = &hpvc_joins[task % hpvc_slots];
	int fds[NNS];
	for (size_t i = 0; i < NNS; i++) {
		fds[i] = -1;
		if (!wanted(j->ns, ORDER[i].name))
			continue;
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)j->pid, ORDER[i].name);
		fds[i] = open(path, O_RDONLY | O_CLOEXEC);
		if (fds[i] < 0) {
			slurm_error("hpvc: node %s: cannot open %s: %s (is the node running?)", j->node, path,
				    strerror(errno));
			goto fail;
		}
	}
	if (join_cgroups(j) < 0)
		goto fail;
	char cwd[PATH_MAX];
	int have_cwd = getcwd(cwd, sizeof(cwd)) != NULL;
	for (size_t i = 0; i < NNS; i++) {
		if (fds[i] < 0)
			continue;
		if (setns(fds[i], ORDER[i].flag) < 0) {
			slurm_error("hpvc: node %s: cannot enter its %s namespace: %s", j->node, ORDER[i].name,
				    strerror(errno));
			goto fail;
		}
		close(fds[i]);
		fds[i] = -1;
	}
	/* The job's directory if the node has it (a shared file system), else /. */
	if (!have_cwd || chdir(cwd) < 0) {
		if (chdir("/") < 0)
			return -1;
	}
	for (int i = 0; i < j->nenv; i++) {
		char *eq = strchr(j->env[i], '=');
		*eq = '\0';
		spank_setenv(sp, j->env[i], eq + 1, 1);
		*eq = '=';
	}
	if (!wanted(j->ns, "pid"))
		return 0;
	pid_t child = fork();
	if (child < 0) {
		slurm_error("hpvc: fork into node %s: %s", j->node, strerror(errno));
		return -1;
	}
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		return 0;
	}
	relay(child);
	return -1; /* not reached */
fail:
	for (size_t i = 0; i < NNS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return -1;
}
