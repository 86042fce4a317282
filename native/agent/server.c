/* hpvc-agent server, in the guest: started by hpvc-init once eth0 has its
 * address (agent.h says who may connect and the frames).
 *
 * The listener forks one handler per connection. A handler reads the command,
 * starts it in a session of its own (stdin, stdout, stderr on pipes, the
 * working directory asked for, else /root), then relays: input frames to the
 * command's stdin, its output to the client, signal frames to its process
 * group. When the command exits, what it wrote is sent, then the end frame,
 * and whatever it left running in its group is killed (a step is over when
 * its task is). When the client goes away first, the group is SIGKILLed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define BASE_ENV 3
static char *const base_env[BASE_ENV] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
	"LANG=C.UTF-8"
};

static void say(int sock, const char *fmt, const char *arg, int err)
{
	char line[512];
	int n = snprintf(line, sizeof(line), fmt, arg, strerror(err));
	if (n > 0)
		hpvc_frame_send(sock, 'r', line, (uint32_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1));
}

static void finish(int sock, int kind, int code)
{
	unsigned char end[2] = { (unsigned char)kind, (unsigned char)code };
	hpvc_frame_send(sock, 'x', end, 2);
	_exit(0);
}

static char *dup_word(const unsigned char *p, uint32_t n)
{
	char *s = malloc(n + 1);
	if (s) {
		memcpy(s, p, n);
		s[n] = '\0';
	}
	return s;
}

/* Is NAME=... set in env? */
static int has_key(char *const env[], int n, const char *kv)
{
	size_t k = strcspn(kv, "=");
	for (int i = 0; i < n; i++)
		if (strncmp(env[i], kv, k) == 0 && env[i][k] == '=')
			return 1;
	return 0;
}

/* Send what is ready in fd to the client as type: 1 while it may have more,
 * 0 at its end (end of file, or an error). */
static int pump(int fd, int sock, char type)
{
	static unsigned char buf[HPVC_AGENT_MAX];
	ssize_t n = read(fd, buf, sizeof(buf));
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 1;
	if (n <= 0)
		return 0;
	if (hpvc_frame_send(sock, type, buf, (uint32_t)n) < 0)
		_exit(1);
	return 1;
}

/* After the command exited: everything it wrote is in the pipe; send it all,
 * without waiting for what something it left behind may write later. */
static void drain(int fd, int sock, char type)
{
	static unsigned char buf[HPVC_AGENT_MAX];
	while (fd >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		if (hpvc_frame_send(sock, type, buf, (uint32_t)n) < 0)
			_exit(1);
	}
}

static void __attribute__((noreturn)) handle(int sock)
{
	static unsigned char buf[HPVC_AGENT_MAX];
	static char *argv[HPVC_AGENT_WORDS + 1], *env[HPVC_AGENT_WORDS + BASE_ENV + 1];
	char *cwd = NULL;
	int argc = 0, envc = 0;
	for (;;) {
		char type;
		uint32_t len;
		if (hpvc_frame_recv(sock, &type, buf, sizeof(buf), &len) != 1)
			_exit(1);
		if (type == 'g')
			break;
		char *w = dup_word(buf, len);
		if (w == NULL)
			_exit(1);
		if (type == 'a' && argc < HPVC_AGENT_WORDS)
			argv[argc++] = w;
		else if (type == 'e' && envc < HPVC_AGENT_WORDS && strchr(w, '=') != NULL)
			env[envc++] = w;
		else if (type == 'd')
			cwd = w;
		else
			_exit(1);
	}
	if (argc == 0) {
		static const char none[] = "hpvc-agent: no command\n";
		hpvc_frame_send(sock, 'r', none, sizeof(none) - 1);
		finish(sock, 0, 2);
	}
	for (int i = 0; i < BASE_ENV; i++)
		if (!has_key(env, envc, base_env[i]))
			env[envc++] = base_env[i];
	argv[argc] = NULL;
	env[envc] = NULL;

	int in[2], out[2], err[2];
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
		say(sock, "hpvc-agent: %s: %s\n", "pipe", errno);
		finish(sock, 0, 126);
	}
	pid_t child = fork();
	if (child < 0) {
		say(sock, "hpvc-agent: %s: %s\n", "fork", errno);
		finish(sock, 0, 126);
	}
	if (child == 0) {
		setsid();
		dup2(in[0], 0);
		dup2(out[1], 1);
		dup2(err[1], 2);
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		for (int s = 1; s < NSIG; s++)
			sigaction(s, &sa, NULL);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		if (cwd == NULL || chdir(cwd) < 0) {
			if (chdir("/root") < 0 && chdir("/") < 0)
				_exit(126);
		}
		/* PATH from the command's environment, as a shell would search it. */
		for (int i = 0; env[i]; i++)
			if (strncmp(env[i], "PATH=", 5) == 0)
				setenv("PATH", env[i] + 5, 1);
		execvpe(argv[0], argv, env);
		dprintf(2, "hpvc-agent: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(errno == ENOENT ? 127 : 126);
	}
	close(in[0]);
	close(out[1]);
	close(err[1]);
	fcntl(in[1], F_SETFL, O_NONBLOCK);
	fcntl(out[0], F_SETFL, O_NONBLOCK);
	fcntl(err[0], F_SETFL, O_NONBLOCK);
	int pidfd = (int)syscall(SYS_pidfd_open, child, 0);

	/* Input waiting for the command to read it (the socket is not read meanwhile). */
	static unsigned char pending[HPVC_AGENT_MAX];
	uint32_t pending_len = 0, pending_off = 0;
	int in_open = 1, status = 0, exited = 0;
	for (;;) {
		struct pollfd fds[5] = {
			/* With input pending only the client's going away is watched. */
			{ sock, pending_len ? POLLRDHUP : POLLIN, 0 },
			{ out[0], POLLIN, 0 },
			{ err[0], POLLIN, 0 },
			{ pidfd, POLLIN, 0 },
			{ pending_len ? in[1] : -1, POLLOUT, 0 },
		};
		if (poll(fds, 5, pidfd < 0 ? 50 : -1) < 0 && errno != EINTR)
			break;
		if (fds[1].revents && fds[1].fd >= 0 && !pump(out[0], sock, 'o')) {
			close(out[0]);
			out[0] = -1;
		}
		if (fds[2].revents && fds[2].fd >= 0 && !pump(err[0], sock, 'r')) {
			close(err[0]);
			err[0] = -1;
		}
		if (fds[4].revents && pending_len) {
			ssize_t k = write(in[1], pending + pending_off, pending_len - pending_off);
			if (k < 0 && errno != EAGAIN && errno != EINTR)
				pending_len = pending_off = 0; /* the command closed its stdin */
			else if (k > 0 && (pending_off += (uint32_t)k) == pending_len)
				pending_len = pending_off = 0;
		}
		if (pending_len && (fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
			kill(-child, SIGKILL);
			waitpid(child, NULL, 0);
			_exit(0);
		}
		if (!pending_len && fds[0].revents) {
			char type;
			uint32_t len;
			if (hpvc_frame_recv(sock, &type, pending, sizeof(pending), &len) != 1) {
				/* The client is gone: so is the command. */
				kill(-child, SIGKILL);
				waitpid(child, NULL, 0);
				_exit(0);
			}
			if (type == 's' && len == 1)
				kill(-child, pending[0]);
			else if (type == 'i' && len == 0 && in_open) {
				close(in[1]);
				in[1] = -1;
				in_open = 0;
			} else if (type == 'i' && in_open)
				pending_len = len;
		}
		/* Exited, but not reaped yet: while the zombie holds its PID, its
		 * process group cannot be another's, so the kill below is safe. */
		siginfo_t si;
		si.si_pid = 0;
		if (!exited && waitid(P_PID, (id_t)child, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
		    si.si_pid == child)
			exited = 1;
		if (exited) {
			/* What the command wrote before it exited is in the pipes. */
			drain(out[0], sock, 'o');
			drain(err[0], sock, 'r');
			kill(-child, SIGKILL);
			while (waitpid(child, &status, 0) < 0 && errno == EINTR)
				;
			if (WIFSIGNALED(status))
				finish(sock, 1, WTERMSIG(status));
			finish(sock, 0, WEXITSTATUS(status));
		}
	}
	kill(-child, SIGKILL);
	_exit(1);
}

/* Only root (a port below 1024) on the cluster's own subnet. */
static int trusted(const struct sockaddr_in *peer, in_addr_t net, in_addr_t mask)
{
	return peer->sin_family == AF_INET && ntohs(peer->sin_port) < 1024 &&
	       (peer->sin_addr.s_addr & mask) == net;
}

int hpvc_agent_start(const char *ip, int prefix)
{
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(HPVC_AGENT_PORT) };
	if (inet_pton(AF_INET, ip, &me.sin_addr) != 1 || prefix < 0 || prefix > 32)
		return -1;
	in_addr_t mask = prefix ? htonl(~0u << (32 - prefix)) : 0;
	in_addr_t net = me.sin_addr.s_addr & mask;
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (lfd < 0)
		return -1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&me, sizeof(me)) < 0 || listen(lfd, 128) < 0) {
		close(lfd);
		return -1;
	}
	pid_t pid = fork();
	if (pid != 0) {
		close(lfd);
		return pid;
	}
	/* The listener: handlers are reaped by the kernel (SIGCHLD ignored). */
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGCHLD, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, SIG_DFL);
	setsid();
	for (;;) {
		struct sockaddr_in peer;
		socklen_t plen = sizeof(peer);
		int c = accept4(lfd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC);
		if (c < 0)
			continue;
		if (!trusted(&peer, net, mask)) {
			static const char no[] =
				"hpvc-agent: refused: only root on the job's hosts and nodes may connect\n";
			hpvc_frame_send(c, 'r', no, sizeof(no) - 1);
			unsigned char end[2] = { 0, 255 };
			hpvc_frame_send(c, 'x', end, 2);
			close(c);
			continue;
		}
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		pid_t h = fork();
		if (h == 0) {
			close(lfd);
			signal(SIGCHLD, SIG_DFL);
			handle(c);
		}
		close(c);
	}
}
