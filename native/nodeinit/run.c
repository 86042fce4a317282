/* hpvc-nodeinit run: the client crun exec starts in the node (nodeinit.h says what). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "nodeinit.h"

extern char **environ;

/* ---- run: the client ----------------------------------------------------- */

static int put_word(char **buf, size_t *len, size_t *cap, const char *w) {
  size_t n = strlen(w) + 1;
  if (*len + n > MAX_REQUEST) return -1;
  while (*len + n > *cap) {
    *cap = *cap ? *cap * 2 : 4096;
    char *b = realloc(*buf, *cap);
    if (!b) return -1;
    *buf = b;
  }
  memcpy(*buf + *len, w, n);
  *len += n;
  return 0;
}

/* The request (nodeinit.h): header, argv, environment; NULL if too large. */
static char *build_request(int argc, char **argv, uint32_t flags, size_t *len) {
  size_t cap = 4096;
  char *buf = malloc(cap);
  uint32_t envc = 0;
  *len = 16; /* the header first, filled in below */
  if (!buf) return NULL;
  for (int i = 0; i < argc; i++)
    if (put_word(&buf, len, &cap, argv[i]) != 0) return NULL;
  for (char **e = environ; *e; e++, envc++)
    if (put_word(&buf, len, &cap, *e) != 0) return NULL;
  mode_t mask = umask(0);
  umask(mask);
  uint32_t h[4] = {flags, (uint32_t)mask, (uint32_t)argc, envc};
  memcpy(buf, h, sizeof h);
  return buf;
}

/* The request's length with our stdio and working directory, then the request. */
static int send_request(int s, const char *buf, size_t len) {
  int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0) cwd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  int fds[4] = {0, 1, 2, cwd};
  union {
    char b[CMSG_SPACE(sizeof fds)];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  uint32_t body = (uint32_t)len;
  struct iovec iov = {.iov_base = &body, .iov_len = sizeof body};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                       .msg_controllen = sizeof u.b};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof fds);
  memcpy(CMSG_DATA(cm), fds, sizeof fds);
  int ok = sendmsg(s, &msg, 0) == (ssize_t)sizeof body && write_full(s, buf, len) == 0;
  close(cwd);
  return ok ? 0 : -1;
}

/* Signals passed on until the init says how the command ended; our exit status. */
static int wait_command(int s, int sfd) {
  for (;;) {
    struct pollfd p[2] = {{.fd = s, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 255;
    }
    if (p[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        unsigned char sig = (unsigned char)si.ssi_signo;
        (void)write_full(s, &sig, 1);
      }
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      uint32_t r[2];
      if (read_full(s, r, sizeof r) != 0) {
        say("the node's init closed the connection");
        return 255;
      }
      if (r[0] == KIND_EXITED) return (int)(r[1] & 0xff);
      if (r[0] == KIND_SIGNALED) return 128 + (int)r[1];
      say("the node's init refused the command: %s%s", strerror((int)r[1]),
          r[1] == EPERM ? " (the caller lacks capabilities the init has)" : "");
      return 126;
    }
  }
}

int run(int argc, char **argv) {
  if (argc < 1) {
    say("usage: hpvc-nodeinit run [--] ARGV...");
    return 2;
  }
  uint32_t flags = 0;
  /* Our controlling terminal (crun exec --tty): given up, for the command to take. */
  if (isatty(0) && tcgetsid(0) == getsid(0) && getsid(0) == getpid()) {
    signal(SIGHUP, SIG_IGN); /* what giving it up sends the session */
    if (ioctl(0, TIOCNOTTY) == 0) flags |= FLAG_TTY;
  }
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  socklen_t salen = sock_addr(&sa);
  if (s < 0 || connect(s, (struct sockaddr *)&sa, salen) != 0) {
    say("the node's init does not answer (%s): is this node's init hpvc-nodeinit serve?",
        strerror(errno));
    return 255;
  }
  size_t len;
  char *buf = build_request(argc, argv, flags, &len);
  if (!buf) {
    say("the command and its environment are too large");
    return 255;
  }
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  int n = (flags & FLAG_TTY) ? 2 : 6; /* with a terminal, its keys signal the command itself */
  int sfd = signal_fd(sigs, n);
  signal(SIGPIPE, SIG_IGN);
  if (sfd < 0 || send_request(s, buf, len) != 0) {
    say("cannot reach the node's init: %s", strerror(errno));
    return 255;
  }
  free(buf);
  return wait_command(s, sfd);
}

int main(int argc, char **argv) {
  const char *base = strrchr(argv[0], '/');
  if (strcmp(base ? base + 1 : argv[0], "hpvc-rsh") == 0) return hpvc_rsh_main(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "serve") == 0)
    return serve(argc >= 3 && strcmp(argv[2], "--agent") == 0);
  if (argc >= 2 && strcmp(argv[1], "run") == 0) {
    int first = 2;
    if (argc > first && strcmp(argv[first], "--") == 0) first++;
    return run(argc - first, argv + first);
  }
  fprintf(stderr, "usage: hpvc-nodeinit serve [--agent] | hpvc-nodeinit run [--] ARGV...\n");
  return 2;
}
