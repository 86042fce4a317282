/* Running hpvc's node commands: fork, exec, capture stdout, log stderr, time out. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hpvc_spank.h"

#ifndef SYS_close_range
#define SYS_close_range 436 /* Linux 5.9, the same number on every architecture */
#endif

extern char **environ;

#define MAX_OUT (1 << 20)

double hpvc_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Progress of `hpvc node up --verbose` (remote.c sets this): its lines that
 * are not "hpvc: " errors reach the srun caller's terminal (slurmstepd's
 * stderr is the job's by user_init) once the command has run this many
 * seconds, so that a quick start stays quiet and a slow one (VM guests
 * booting) says what it waits for; every one goes to slurmd's log. -1: no
 * progress, every line is an error. */
double hpvc_progress_after = -1;

/* The progress lines not yet shown, and when they may be. */
static struct {
	double from;
	char held[8192];
	size_t len;
} progress;

static void show_progress(void)
{
	if (progress.len > 0 && write(2, progress.held, progress.len) < 0)
		slurm_info("hpvc: cannot show progress on the job's stderr: %s", strerror(errno));
	progress.len = 0;
}

/* One line of stderr: an error, or progress held until progress.from. */
static void log_line(const char *line)
{
	int error = strncmp(line, "hpvc: ", 6) == 0;
	if (hpvc_progress_after < 0 || error) {
		slurm_error("hpvc: %s", error ? line + 6 : line);
		return;
	}
	slurm_info("hpvc: %s", line);
	int n = snprintf(progress.held + progress.len, sizeof(progress.held) - progress.len,
			 "hpvc: %s\n", line);
	if (n > 0 && (size_t)n < sizeof(progress.held) - progress.len)
		progress.len += (size_t)n;
	if (hpvc_now() >= progress.from)
		show_progress();
}

/* Log complete stderr lines as they come; keep a partial one for later. */
static void log_lines(char *buf, size_t *len, int flush)
{
	char *start = buf, *nl;
	while ((nl = memchr(start, '\n', *len - (size_t)(start - buf))) != NULL) {
		*nl = '\0';
		if (*start)
			log_line(start);
		start = nl + 1;
	}
	size_t rest = *len - (size_t)(start - buf);
	if (flush && rest > 0) {
		buf[*len] = '\0';
		log_line(start);
		rest = 0;
	}
	memmove(buf, start, rest);
	*len = rest;
}

/* The local check (as the user) keeps the user's environment, env entries
 * winning over inherited ones of the same name; root runs get env alone. */
static char **child_env(char *const extra[], int inherit)
{
	size_t n = 0, m = 0;
	while (inherit && environ && environ[n])
		n++;
	while (extra && extra[m])
		m++;
	char **env = calloc(n + m + 1, sizeof(char *));
	if (env == NULL)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < m; i++)
		env[k++] = extra[i];
	for (size_t i = 0; i < n; i++) {
		const char *eq = strchr(environ[i], '=');
		size_t klen = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
		int dup = 0;
		for (size_t j = 0; j < m; j++)
			if (strncmp(extra[j], environ[i], klen) == 0 && extra[j][klen] == '=')
				dup = 1;
		if (!dup)
			env[k++] = environ[i];
	}
	env[k] = NULL;
	return env;
}

/* Nothing of the caller's open files (slurmstepd's sockets, srun's) beyond
 * stdin, stdout and stderr. */
void hpvc_close_above_stderr(void)
{
	if (syscall(SYS_close_range, 3, ~0U, 0) == 0)
		return;
	long max = sysconf(_SC_OPEN_MAX);
	for (long fd = 3; fd < (max > 0 ? max : 65536); fd++)
		close((int)fd);
}

/* Signals blocked or ignored by the caller stay so across execve: start
 * hpvc (and what it runs) with the defaults. */
static void default_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			sigaction(sig, &sa, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}

/* In the forked child: stdin from /dev/null, stdout and stderr into the
 * pipes, root for good with as_root, then hpvc with env. */
static void __attribute__((noreturn)) exec_child(char *const argv[], char **env, int as_root, int out,
						 int err)
{
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
		_exit(127);
	/* slurmstepd runs user_init with the user's effective ids and root's
	 * saved ones: the child takes root back for good (hpvc changes the host). */
	if (as_root && (setresuid(0, 0, 0) < 0 || setresgid(0, 0, 0) < 0 || setgroups(0, NULL) < 0)) {
		dprintf(2, "cannot become root to run %s: %s\n", argv[0], strerror(errno));
		_exit(126);
	}
	/* Not the user's working directory (it may be theirs to replace
	 * under a running root process) nor their umask. */
	if (as_root && chdir("/") < 0) {
		dprintf(2, "cannot change to /: %s\n", strerror(errno));
		_exit(126);
	}
	if (as_root)
		umask(022);
	hpvc_close_above_stderr();
	default_signals();
	/* New session: on a timeout the whole group is killed, nothing else. */
	setsid();
	execve(argv[0], argv, env);
	dprintf(2, "cannot run %s: %s (set hpvc=PATH in plugstack.conf)\n", argv[0], strerror(errno));
	_exit(127);
}

/* Fork the child writing into out and err: its PID, or -1. */
static pid_t spawn(char *const argv[], char *const env_in[], int as_root, int out, int err)
{
	if (as_root && env_in == NULL)
		return -1;
	char **env = child_env(env_in, !as_root);
	if (env == NULL)
		return -1;
	pid_t pid = fork();
	if (pid == 0)
		exec_child(argv, env, as_root, out, err);
	free(env);
	return pid;
}

/* The child's stdout, kept (buf is NULL when it could not be allocated). */
struct capture {
	char *buf;
	size_t len, cap;
};

/* Read what is ready on fd into c, growing it up to MAX_OUT: 1 while more
 * may come, 0 at the end (or once full), -1 when out of memory. */
static int take_stdout(int fd, struct capture *c)
{
	if (c->len + 4096 + 1 > c->cap && c->cap < MAX_OUT) {
		char *bigger = realloc(c->buf, c->cap * 2);
		if (bigger == NULL)
			return -1;
		c->buf = bigger;
		c->cap *= 2;
	}
	ssize_t n = c->len + 4096 + 1 <= c->cap ? read(fd, c->buf + c->len, 4096) : 0;
	if (n <= 0)
		return 0;
	c->len += (size_t)n;
	return 1;
}

#define ERR_LINE 4096 /* longest stderr line logged whole */

/* Read what is ready on fd into buf (ERR_LINE + 1 bytes), logging each
 * complete line: 1 while more may come, 0 at the end. */
static int take_stderr(int fd, char *buf, size_t *len)
{
	ssize_t n = read(fd, buf + *len, ERR_LINE - *len);
	if (n <= 0)
		return 0;
	*len += (size_t)n;
	log_lines(buf, len, *len == ERR_LINE);
	return 1;
}

/* How long to poll, at most left ms: until held progress is due, if sooner
 * (and show it when it is). */
static int progress_wait(int left)
{
	if (progress.len == 0)
		return left;
	double due = (progress.from - hpvc_now()) * 1000;
	if (due <= 0) {
		show_progress();
		return left;
	}
	return due + 1 < left ? (int)due + 1 : left;
}

/* Collect stdout into c and log stderr until both end or timeout_s pass:
 * 1 when the time ran out, else 0. */
static int collect(int ofd, int efd, int timeout_s, struct capture *c)
{
	char ebuf[ERR_LINE + 1];
	size_t elen = 0;
	int open_fds = 2, timed_out = 0;
	double deadline = hpvc_now() + timeout_s;
	progress.from = hpvc_now() + hpvc_progress_after;
	progress.len = 0;
	struct pollfd fds[2] = { { ofd, POLLIN, 0 }, { efd, POLLIN, 0 } };
	while (c->buf != NULL && open_fds > 0) {
		int left = (int)((deadline - hpvc_now()) * 1000);
		if (left <= 0) {
			timed_out = 1;
			break;
		}
		int r = poll(fds, 2, progress_wait(left));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			break;
		if (fds[0].revents) {
			int more = take_stdout(ofd, c);
			if (more < 0)
				break;
			if (more == 0) {
				fds[0].fd = -1;
				open_fds--;
			}
		}
		if (fds[1].revents && !take_stderr(efd, ebuf, &elen)) {
			fds[1].fd = -1;
			open_fds--;
		}
	}
	log_lines(ebuf, &elen, 1);
	progress.len = 0; /* done before it was time to show them: a quick start says nothing */
	return timed_out;
}

/* Wait for the child, its group killed first when it timed out: its exit
 * status, or -1 (timed out, killed, not waited for). */
static int reap(pid_t pid, char *const argv[], int timeout_s, int timed_out)
{
	if (timed_out) {
		slurm_error("hpvc: %s %s did not finish in %d s (timeout= in plugstack.conf)",
			    argv[0], argv[1] ? argv[1] : "", timeout_s);
		kill(-pid, SIGKILL);
	}
	int status = 0, waited;
	while ((waited = (int)waitpid(pid, &status, 0)) < 0 && errno == EINTR)
		;
	if (waited < 0) {
		slurm_error("hpvc: cannot wait for %s: %s", argv[0], strerror(errno));
		return -1;
	}
	if (timed_out || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

int hpvc_run(char *const argv[], char *const env_in[], int timeout_s, int as_root, char **out)
{
	int opipe[2], epipe[2];
	*out = NULL;
	if (pipe2(opipe, O_CLOEXEC) < 0)
		return -1;
	if (pipe2(epipe, O_CLOEXEC) < 0) {
		close(opipe[0]);
		close(opipe[1]);
		return -1;
	}
	pid_t pid = spawn(argv, env_in, as_root, opipe[1], epipe[1]);
	close(opipe[1]);
	close(epipe[1]);
	if (pid < 0) {
		close(opipe[0]);
		close(epipe[0]);
		return -1;
	}
	struct capture c = { malloc(4096), 0, 4096 };
	int timed_out = collect(opipe[0], epipe[0], timeout_s, &c);
	close(opipe[0]);
	close(epipe[0]);
	int rc = reap(pid, argv, timeout_s, timed_out);
	if (c.buf == NULL)
		return -1;
	c.buf[c.len] = '\0';
	*out = c.buf;
	return rc;
}
