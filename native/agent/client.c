/* hpvc-agent client: connect from a reserved port, send the command, relay
 * stdin, stdout, stderr and signals until the command's end frame (agent.h).
 * Used by the SPANK plugin's task relay (host) and by hpvc-rsh (guests). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"

static int connect_once(const struct sockaddr_in *to)
{
	/* Like bindresvport(3), which glibc no longer exports for new code:
	 * the first free port from 1023 down; only root may bind them. */
	for (int local = 1023; local >= 512; local--) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		struct sockaddr_in from = { .sin_family = AF_INET, .sin_port = htons((uint16_t)local) };
		if (bind(fd, (struct sockaddr *)&from, sizeof(from)) < 0) {
			int err = errno;
			close(fd);
			if (err == EADDRINUSE)
				continue;
			errno = err;
			return -1;
		}
		if (connect(fd, (const struct sockaddr *)to, sizeof(*to)) == 0) {
			int one = 1;
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			return fd;
		}
		int err = errno;
		close(fd);
		if (err != EADDRNOTAVAIL && err != EADDRINUSE) {
			errno = err;
			return -1;
		}
	}
	errno = EADDRINUSE;
	return -1;
}

/* A few tries where the address does not answer ARP: a just-booted TCG guest
 * has left the host's 3 s of ARP unanswered right after its hpvc-ready line
 * (clean-clone CI runs, stops 37 and 43: "No route to host"), as ssh's
 * ConnectionAttempts covers for ssh (backends/vm/guest.py). A guest that is
 * gone still fails, after about CONNECT_TRIES * 4 s. */
#define CONNECT_TRIES 3

int hpvc_agent_connect(const char *ip, int port)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, ip, &to.sin_addr) != 1) {
		errno = EINVAL;
		return -1;
	}
	for (int tries = 1;; tries++) {
		int fd = connect_once(&to);
		if (fd >= 0 || errno != EHOSTUNREACH || tries == CONNECT_TRIES)
			return fd;
		sleep(1);
	}
}

static int sig_pipe[2] = { -1, -1 };

static void on_signal(int sig)
{
	int saved = errno;
	unsigned char b = (unsigned char)sig;
	(void)!write(sig_pipe[1], &b, 1);
	errno = saved;
}

static const int relayed[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
				SIGUSR2, SIGCONT, SIGALRM, SIGTSTP };

/* The client's terminal, when the command has one in the guest (tty.c). */
static int tty_fd = -1;
static const char *tty_term;

void hpvc_agent_use_tty(int tty, const char *term)
{
	tty_fd = tty;
	tty_term = term;
}

static int catch_signals(void)
{
	if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
		return -1;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART;
	sigset_t set;
	sigemptyset(&set);
	for (size_t i = 0; i < sizeof(relayed) / sizeof(relayed[0]); i++) {
		sigaction(relayed[i], &sa, NULL);
		sigaddset(&set, relayed[i]);
	}
	if (tty_fd >= 0) { /* the window's size, sent as 'w' (tty.c) */
		sigaction(SIGWINCH, &sa, NULL);
		sigaddset(&set, SIGWINCH);
	}
	signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the relay */
	return sigprocmask(SIG_UNBLOCK, &set, NULL);
}

static int send_words(int sock, char type, char *const words[])
{
	for (int i = 0; words && words[i]; i++) {
		size_t n = strlen(words[i]);
		if (i >= HPVC_AGENT_WORDS || n > HPVC_AGENT_MAX ||
		    hpvc_frame_send(sock, type, words[i], (uint32_t)n) < 0)
			return -1;
	}
	return 0;
}

int hpvc_agent_run(int sock, char *const argv[], char *const env[], const char *cwd,
		   const char *fallback, int in_fd, const char **why)
{
	static unsigned char buf[HPVC_AGENT_MAX];
	*why = "";
	if (catch_signals() < 0) {
		*why = "cannot catch signals";
		return -256;
	}
	/* The command in as few segments as fit: a task's environment is a hundred
	 * frames, and each segment costs the guest an interrupt (dear under TCG). */
	int on = 1, off = 0;
	setsockopt(sock, IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
	if (send_words(sock, 'a', argv) < 0 || send_words(sock, 'e', env) < 0 ||
	    (cwd && hpvc_frame_send(sock, 'd', cwd, (uint32_t)strlen(cwd)) < 0) ||
	    (fallback && hpvc_frame_send(sock, 'd', fallback, (uint32_t)strlen(fallback)) < 0) ||
	    (tty_fd >= 0 && hpvc_tty_send_start(sock, tty_fd, tty_term) < 0) ||
	    hpvc_chan_send_asks(sock) < 0 ||
	    hpvc_frame_send(sock, 'g', NULL, 0) < 0 ||
	    (in_fd < 0 && hpvc_frame_send(sock, 'i', NULL, 0) < 0)) {
		*why = "cannot send the command";
		return -256;
	}
	setsockopt(sock, IPPROTO_TCP, TCP_CORK, &off, sizeof(off));
	struct pollfd fds[4 + HPVC_CHAN_MAX] = { /* then the PMI channels (chan.c) */
		{ sock, POLLIN, 0 }, { sig_pipe[0], POLLIN, 0 }, { in_fd, POLLIN, 0 }
	};
	int nfds = in_fd >= 0 ? 3 : 2;
	for (;;) {
		int nch = hpvc_chan_poll(fds + 3); /* fds[2]: -1 once the input ended */
		/* With a terminal, its size is looked at twice a second too (tty.c). */
		int ready = poll(fds, (nfds_t)(3 + nch), tty_fd >= 0 ? 500 : -1);
		if (ready == 0 && hpvc_tty_send_size(sock, tty_fd) < 0) {
			*why = "cannot send the window's size";
			return -256;
		}
		if (ready < 0) {
			if (errno == EINTR)
				continue;
			*why = "poll failed";
			return -256;
		}
		if (fds[1].revents & POLLIN) {
			unsigned char sig;
			while (read(sig_pipe[0], &sig, 1) == 1)
				if (sig == SIGWINCH ? hpvc_tty_send_size(sock, tty_fd) < 0
						    : hpvc_frame_send(sock, 's', &sig, 1) < 0)
					break;
		}
		if (nch && hpvc_chan_ready(sock, fds + 3, nch) < 0)
			return (*why = "cannot send a PMI channel's data", -256);
		if (nfds == 3 && fds[2].revents) {
			ssize_t n = read(in_fd, buf, sizeof(buf));
			if (n < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			/* End of input, or an unreadable one: the command's stdin ends. */
			if (hpvc_frame_send(sock, 'i', buf, n > 0 ? (uint32_t)n : 0) < 0) {
				*why = "cannot send input";
				return -256;
			}
			if (n <= 0)
				nfds = 2, fds[2].fd = -1;
		}
		if (fds[0].revents) {
			char type;
			uint32_t len = 0;
			int rc = hpvc_frame_recv(sock, &type, buf, sizeof(buf), &len);
			if (rc <= 0) {
				*why = rc == 0 ? "the node closed the connection"
					       : "the connection to the node broke";
				return -256;
			}
			/* A reader that went away drops the output; the run goes on. */
			if (type == 'o')
				(void)hpvc_write_all(STDOUT_FILENO, buf, len);
			else if (type == 'r')
				(void)hpvc_write_all(STDERR_FILENO, buf, len);
			else if (type == 'x' && len == 2)
				return buf[0] == 0 ? buf[1] : -(int)buf[1];
			else if (memchr("Ccq", type, 3) && hpvc_chan_frame(sock, type, buf, len) < 0)
				return (*why = "a malformed PMI channel frame", -256);
		}
	}
}
