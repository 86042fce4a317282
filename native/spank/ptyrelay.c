/* `srun --pty` into a container node: a terminal of the node's own
 * (task_init, as the user, in the node's namespaces; docs/slurm.md).
 *
 * With --pty, slurmstepd gives task 0 a pty of the host's devpts as its
 * controlling terminal. Inside the node that pty has no name (the node's
 * /dev/pts is its own devpts instance), so `tty` says "not a tty" and programs
 * that open their terminal by name fail. So the task opens a pty in the
 * node's devpts (/dev/ptmx, which any user may), forks, and the child (the
 * user's program: slurmstepd execs it) takes the node's pty as its
 * controlling terminal in a session of its own, with the host pty's modes
 * and window size. This process stays as `hpvc-tty`: it puts the host pty in
 * raw mode and copies bytes both ways, so the node pty's line discipline is
 * the one that turns Ctrl-C and Ctrl-Z into signals for the node's
 * foreground job; a window size change (SIGWINCH from slurmstepd's resize of
 * the host pty, whose foreground group this process is) is passed on; and it
 * exits as the program did, so srun reports the program's exit status.
 * Hand-written: the byte copy and SIGWINCH are the whole of it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "hpvc_spank.h"

static volatile sig_atomic_t resized, program;

static void on_winch(int sig)
{
	(void)sig;
	resized = 1;
}

static void on_forward(int sig)
{
	if (program > 0)
		kill((pid_t)program, sig);
}

/* All of buf to fd (blocking); -1 if fd is gone. */
static int put(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Copy host tty (in 0, out 1) <-> node pty master until the program ends,
 * then what it left in the master; returns its wait status. */
static int copy(int master, pid_t child)
{
	char buf[16384];
	int status = 0, done = 0, in_open = 1;
	for (;;) {
		if (resized) {
			resized = 0;
			struct winsize ws;
			if (ioctl(0, TIOCGWINSZ, &ws) == 0)
				ioctl(master, TIOCSWINSZ, &ws);
		}
		if (!done) {
			pid_t w = waitpid(child, &status, WNOHANG);
			done = w == child || (w < 0 && errno == ECHILD);
		}
		struct pollfd p[2] = { { .fd = master, .events = POLLIN },
				       { .fd = in_open ? 0 : -1, .events = POLLIN } };
		/* Once the program ended, only what it left in the master. */
		int r = poll(p, done ? 1 : 2, done ? 100 : 250);
		if (r < 0 && errno != EINTR)
			break;
		if (r <= 0) {
			if (done)
				break;
			continue;
		}
		if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t n = read(master, buf, sizeof(buf));
			if (n > 0)
				put(1, buf, (size_t)n);
			else if (n < 0 && errno != EINTR && errno != EAGAIN && done)
				break; /* EIO: no one holds the node's pty any more */
			else if (n == 0 && done)
				break;
		}
		if (!done && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
			ssize_t n = read(0, buf, sizeof(buf));
			if (n > 0)
				put(master, buf, (size_t)n);
			else if (n == 0 || (errno != EINTR && errno != EAGAIN))
				in_open = 0;
		}
	}
	while (!done) {
		pid_t w = waitpid(child, &status, 0);
		done = w == child || (w < 0 && errno != EINTR);
	}
	return status;
}

/* Exit as a waited-for child did: its exit code, or the same signal. */
void hpvc_exit_as(int status)
{
	if (WIFSIGNALED(status)) {
		int sig = WTERMSIG(status);
		sigset_t set;
		signal(sig, SIG_DFL);
		sigemptyset(&set);
		sigaddset(&set, sig);
		sigprocmask(SIG_UNBLOCK, &set, NULL);
		raise(sig);
	}
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128);
}

int hpvc_task_tty(spank_t sp)
{
	int task = -1;
	if (spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task < 0 || hpvc_slots <= 0)
		return 0;
	const struct hpvc_join *j = &hpvc_joins[task % hpvc_slots];
	/* Only a container task with --pty: its stdin is slurmstepd's pty. VM
	 * tasks run in their guest (vm.c). */
	if (j->vm || !(j->nsflags & CLONE_NEWNS) || !isatty(0))
		return 0;
	struct termios mode;
	struct winsize ws;
	int have_mode = tcgetattr(0, &mode) == 0;
	int have_ws = ioctl(0, TIOCGWINSZ, &ws) == 0;
	int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	char name[64];
	if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 ||
	    ptsname_r(master, name, sizeof(name)) != 0) {
		slurm_error("hpvc: node %s has no terminal for --pty (/dev/ptmx: %s); the program runs on the host's pty instead",
			    j->node, strerror(errno));
		if (master >= 0)
			close(master);
		return 0;
	}
	if (have_ws)
		ioctl(master, TIOCSWINSZ, &ws);
	pid_t child = fork();
	if (child < 0) {
		slurm_error("hpvc: --pty: fork: %s", strerror(errno));
		close(master);
		return -1;
	}
	if (child == 0) {
		/* The program: a session of its own, the node's pty its terminal. */
		close(master);
		int slave = -1;
		if (setsid() < 0 || (slave = open(name, O_RDWR)) < 0 ||
		    ioctl(slave, TIOCSCTTY, 0) < 0) {
			slurm_error("hpvc: --pty: cannot take node %s's terminal %s: %s", j->node, name,
				    strerror(errno));
			_exit(127);
		}
		if (have_mode)
			tcsetattr(slave, TCSANOW, &mode);
		for (int fd = 0; fd < 3; fd++)
			if (isatty(fd) && dup2(slave, fd) < 0)
				_exit(127);
		if (slave > 2)
			close(slave);
		return 0;
	}
	/* The relay between the host's pty and the node's. */
	program = child;
	prctl(PR_SET_NAME, "hpvc-tty", 0, 0, 0);
	prctl(PR_SET_PDEATHSIG, SIGHUP);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_winch;
	sigaction(SIGWINCH, &sa, NULL);
	sa.sa_handler = on_forward;
	int fwd[] = { SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGALRM, SIGINT };
	for (size_t i = 0; i < sizeof(fwd) / sizeof(fwd[0]); i++)
		sigaction(fwd[i], &sa, NULL);
	/* Ctrl-Z, Ctrl-C as bytes: the node's pty makes them signals. */
	if (have_mode) {
		struct termios raw = mode;
		cfmakeraw(&raw);
		tcsetattr(0, TCSANOW, &raw);
	}
	resized = 1; /* a resize before the handler was set */
	int status = copy(master, child);
	if (have_mode)
		tcsetattr(0, TCSANOW, &mode);
	close(master);
	hpvc_exit_as(status);
}
