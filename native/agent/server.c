/* hpvc-agent server, in the guest: started by hpvc-init once eth0 has its
 * address (agent.h says who may connect and the frames).
 *
 * The listener forks one handler per connection. A handler first checks the
 * client holds the job's secret (auth.c), then reads the command,
 * starts it in a session of its own (stdin, stdout, stderr on pipes, the
 * first working directory asked for that the guest has, else /root), then
 * relays: input frames to the command's stdin, its output to the client,
 * signal frames to its process group. When the command exits, what it wrote is sent, then the end frame,
 * and whatever it left running in its group is killed (a step is over when
 * its task is). When the client goes away first, the group is SIGKILLed.
 *
 * Long because one connection's life is one process's: reading the command,
 * starting it (pipes or a terminal), relaying, and the ends; Slurm's PMI
 * channels beside it are chan.c's, hooked in here at four places. */
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
#include <sys/ioctl.h>
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

/* "hpvc-agent: WHAT: REASON" on the client's stderr. */
static void say(int sock, const char *what, int err)
{
	char line[512];
	int n = snprintf(line, sizeof(line), "hpvc-agent: %s: %s\n", what, strerror(err));
	if (n > 0)
		hpvc_frame_send(sock, 'r', line, (uint32_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1));
}

static void __attribute__((noreturn)) finish(int sock, int kind, int code)
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

/* The command a client asked for: argv and environment NULL-ended. */
struct command {
	char *argv[HPVC_AGENT_WORDS + 1];
	char *env[HPVC_AGENT_WORDS + BASE_ENV + 3]; /* + PMI_FD (chan.c), TERM, NULL */
	char *cwd[2]; /* tried in order (the job's, the image's WorkingDir), then /root */
	int argc, envc, ndirs;
	int tty;                 /* 't' came: a terminal (pty.c) */
	unsigned char size[4];   /* its rows and columns */
	char term[80];           /* "TERM=..." from 't', where the client sent one */
};

/* One command being relayed. */
struct relay {
	int sock;
	pid_t child;
	int pidfd;         /* -1 without pidfd_open: poll the child every 50 ms */
	int in, out, err;  /* its stdin (write end), stdout, stderr (read ends); -1 once closed */
	int tty;           /* the pty's master, which in and out are; -1 without a terminal */
	/* Input waiting for the command to read it (the socket is not read meanwhile). */
	unsigned char pending[HPVC_AGENT_MAX];
	uint32_t pending_len, pending_off;
};

/* The client's frames up to 'g' (start): the words, the environment (the
 * base entries added where the client set no value) and the directory. A
 * command without words ends the connection with exit code 2. */
static void read_command(int sock, struct command *c)
{
	static unsigned char buf[HPVC_AGENT_MAX];
	for (;;) {
		char type;
		uint32_t len;
		if (hpvc_frame_recv(sock, &type, buf, sizeof(buf), &len) != 1)
			_exit(1);
		if (type == 'g')
			break;
		if (type == 't' && len >= 4 && len - 4 < sizeof(c->term) - 5) {
			c->tty = 1;
			memcpy(c->size, buf, 4);
			if (len > 4)
				snprintf(c->term, sizeof(c->term), "TERM=%.*s", (int)(len - 4), buf + 4);
			continue;
		}
		if ((type == 'p' || type == 'P') && hpvc_chan_ask(type, buf, len) == 0)
			continue; /* Slurm's PMIx / PMI-2 (chan.c); a malformed one ends below */
		char *w = dup_word(buf, len);
		if (w == NULL)
			_exit(1);
		if (type == 'a' && c->argc < HPVC_AGENT_WORDS)
			c->argv[c->argc++] = w;
		else if (type == 'e' && c->envc < HPVC_AGENT_WORDS && strchr(w, '=') != NULL)
			c->env[c->envc++] = w;
		else if (type == 'd' && c->ndirs < 2)
			c->cwd[c->ndirs++] = w;
		else
			_exit(1);
	}
	if (c->argc == 0) {
		static const char none[] = "hpvc-agent: no command\n";
		hpvc_frame_send(sock, 'r', none, sizeof(none) - 1);
		finish(sock, 0, 2);
	}
	if (hpvc_chan_guest_prepare(c->env, &c->envc, HPVC_AGENT_WORDS + 1) < 0) {
		say(sock, "cannot set up the PMI channel", errno);
		finish(sock, 0, 126);
	}
	if (c->term[0] && !has_key(c->env, c->envc, c->term))
		c->env[c->envc++] = c->term;
	for (int i = 0; i < BASE_ENV; i++)
		if (!has_key(c->env, c->envc, base_env[i]))
			c->env[c->envc++] = base_env[i];
	c->argv[c->argc] = NULL;
	c->env[c->envc] = NULL;
}

/* In the forked child: a session of its own, the pipes as stdin, stdout and
 * stderr, default signals, the working directory, then the command. */
static void __attribute__((noreturn)) exec_command(const struct command *c, int in, int out, int err)
{
	setsid();
	dup2(in, 0);
	dup2(out, 1);
	dup2(err, 2);
	if (c->tty) /* the pty's slave: the session's controlling terminal (pty.c) */
		ioctl(0, TIOCSCTTY, 0);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	for (int s = 1; s < NSIG; s++)
		sigaction(s, &sa, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	int in_dir = 0;
	for (int i = 0; i < c->ndirs && !in_dir; i++)
		in_dir = chdir(c->cwd[i]) == 0;
	if (!in_dir && chdir("/root") < 0 && chdir("/") < 0)
		_exit(126);
	/* PATH from the command's environment, as a shell would search it. */
	for (int i = 0; c->env[i]; i++)
		if (strncmp(c->env[i], "PATH=", 5) == 0)
			setenv("PATH", c->env[i] + 5, 1);
	execvpe(c->argv[0], c->argv, c->env);
	dprintf(2, "hpvc-agent: cannot run %s: %s\n", c->argv[0], strerror(errno));
	_exit(errno == ENOENT ? 127 : 126);
}

/* Start the command on a pty (pty.c): its master is r's input and output. */
static void start_tty(int sock, const struct command *c, struct relay *r)
{
	int slave = -1, master = hpvc_pty_open(&slave, c->size, 4);
	if (master < 0) {
		say(sock, "cannot open a terminal", errno);
		finish(sock, 0, 126);
	}
	pid_t child = fork();
	if (child < 0) {
		say(sock, "fork", errno);
		finish(sock, 0, 126);
	}
	if (child == 0)
		exec_command(c, slave, slave, slave);
	close(slave);
	fcntl(master, F_SETFL, O_NONBLOCK);
	r->sock = sock;
	r->child = child;
	r->tty = master;
	r->in = dup(master);
	r->out = master;
	r->err = -1;
	r->pidfd = (int)syscall(SYS_pidfd_open, child, 0);
}

/* Start the command on non-blocking pipes into r; a failure ends the
 * connection with exit code 126. */
static void start_command(int sock, const struct command *c, struct relay *r)
{
	int in[2], out[2], err[2];
	r->tty = -1;
	if (c->tty) {
		start_tty(sock, c, r);
		return;
	}
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
		say(sock, "pipe", errno);
		finish(sock, 0, 126);
	}
	pid_t child = fork();
	if (child < 0) {
		say(sock, "fork", errno);
		finish(sock, 0, 126);
	}
	if (child == 0)
		exec_command(c, in[0], out[1], err[1]);
	close(in[0]);
	close(out[1]);
	close(err[1]);
	fcntl(in[1], F_SETFL, O_NONBLOCK);
	fcntl(out[0], F_SETFL, O_NONBLOCK);
	fcntl(err[0], F_SETFL, O_NONBLOCK);
	r->sock = sock;
	r->child = child;
	r->in = in[1];
	r->out = out[0];
	r->err = err[0];
	r->pidfd = (int)syscall(SYS_pidfd_open, child, 0);
}

/* The client is gone: so is the command. */
static void __attribute__((noreturn)) abandon(const struct relay *r)
{
	if (r->tty >= 0)
		hpvc_pty_kill_session(r->child);
	kill(-r->child, SIGKILL);
	waitpid(r->child, NULL, 0);
	_exit(0);
}

/* Write what the command's stdin takes of the pending input. */
static void feed_input(struct relay *r)
{
	ssize_t k = write(r->in, r->pending + r->pending_off, r->pending_len - r->pending_off);
	if (k < 0 && errno != EAGAIN && errno != EINTR)
		r->pending_len = r->pending_off = 0; /* the command closed its stdin */
	else if (k > 0 && (r->pending_off += (uint32_t)k) == r->pending_len)
		r->pending_len = r->pending_off = 0;
}

/* One frame from the client: a signal for the command's group, input for
 * its stdin (empty: the end of it). */
static void from_client(struct relay *r)
{
	char type;
	uint32_t len;
	if (hpvc_frame_recv(r->sock, &type, r->pending, sizeof(r->pending), &len) != 1)
		abandon(r);
	if (type == 's' && len == 1 && r->tty >= 0)
		hpvc_pty_signal(r->tty, r->child, r->pending[0]);
	else if (type == 's' && len == 1)
		kill(-r->child, r->pending[0]);
	else if (type == 'w' && r->tty >= 0)
		hpvc_pty_resize(r->tty, r->pending, len);
	else if (type == 'i' && len == 0 && r->tty >= 0)
		; /* a terminal's input does not end: Ctrl-D is a byte the command reads */
	else if (type == 'i' && len == 0 && r->in >= 0) {
		close(r->in);
		r->in = -1;
	} else if (type == 'i' && r->in >= 0)
		r->pending_len = len;
	else if ((type == 'c' || type == 'q') && hpvc_chan_frame(r->sock, type, r->pending, len) < 0)
		abandon(r);
}

/* Exited, but not reaped yet: while the zombie holds its PID, its process
 * group cannot be another's, so killing the group is safe. */
static int exited(pid_t child)
{
	siginfo_t si;
	si.si_pid = 0;
	return waitid(P_PID, (id_t)child, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
	       si.si_pid == child;
}

/* After the command exited: what it wrote before (it is in the pipes), then
 * whatever it left in its group killed, then its end frame. */
static void __attribute__((noreturn)) end_exited(const struct relay *r)
{
	drain(r->out, r->sock, 'o');
	drain(r->err, r->sock, 'r');
	if (r->tty >= 0)
		hpvc_pty_kill_session(r->child);
	kill(-r->child, SIGKILL);
	int status = 0;
	while (waitpid(r->child, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(status))
		finish(r->sock, 1, WTERMSIG(status));
	finish(r->sock, 0, WEXITSTATUS(status));
}

/* Relay until the command exits or the client goes away. */
static void __attribute__((noreturn)) relay(struct relay *r)
{
	for (;;) {
		struct pollfd fds[6 + HPVC_CHAN_MAX] = {
			/* With input pending only the client's going away is watched. */
			{ r->sock, r->pending_len ? POLLRDHUP : POLLIN, 0 },
			{ r->out, POLLIN, 0 },
			{ r->err, POLLIN, 0 },
			{ r->pidfd, POLLIN, 0 },
			{ r->pending_len ? r->in : -1, POLLOUT, 0 },
		};
		int nch = hpvc_chan_poll(fds + 5); /* Slurm's PMIx / PMI-2 (chan.c) */
		if (poll(fds, (nfds_t)(5 + nch), r->pidfd < 0 ? 50 : -1) < 0 && errno != EINTR)
			break;
		if (nch && hpvc_chan_ready(r->sock, fds + 5, nch) < 0)
			abandon(r);
		if (fds[1].revents && fds[1].fd >= 0 && !pump(r->out, r->sock, 'o')) {
			close(r->out);
			r->out = -1;
		}
		if (fds[2].revents && fds[2].fd >= 0 && !pump(r->err, r->sock, 'r')) {
			close(r->err);
			r->err = -1;
		}
		if (fds[4].revents && r->pending_len)
			feed_input(r);
		if (r->pending_len && (fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR)))
			abandon(r);
		if (!r->pending_len && fds[0].revents)
			from_client(r);
		if (exited(r->child))
			end_exited(r);
	}
	kill(-r->child, SIGKILL);
	_exit(1);
}

/* The job's secret (agent.h), kept in memory only. */
static unsigned char agent_key[HPVC_AGENT_KEY_MAX];
static size_t agent_key_len;

/* One connection, in its own process: the client proves it holds the job's
 * secret (the second fence, after the port), then the command, the relay. */
static void __attribute__((noreturn)) handle(int sock)
{
	static struct command cmd;
	static struct relay r;
	int ok = hpvc_agent_challenge(sock, agent_key, agent_key_len);
	if (ok == 0)
		hpvc_agent_refuse(sock, agent_key_len ? "the client does not hold the job's agent key"
					   : "this node has no agent key (it booted without one)");
	if (ok != 1)
		_exit(1);
	read_command(sock, &cmd);
	start_command(sock, &cmd, &r);
	hpvc_chan_guest_started();
	relay(&r);
}

/* Only root (a port below 1024) on the cluster's own subnet. */
static int trusted(const struct sockaddr_in *peer, in_addr_t net, in_addr_t mask)
{
	return peer->sin_family == AF_INET && ntohs(peer->sin_port) < 1024 &&
	       (peer->sin_addr.s_addr & mask) == net;
}

int hpvc_agent_start(const char *ip, int prefix, const unsigned char *key, size_t klen)
{
	agent_key_len = key && klen <= sizeof(agent_key) ? klen : 0;
	if (agent_key_len)
		memcpy(agent_key, key, agent_key_len);
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
			hpvc_agent_refuse(c, "only root on the job's hosts and nodes may connect");
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
