/* hpvc-nodeinit serve: the node's init and its sessions (nodeinit.h says what). */
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

static void reply(int fd, uint32_t kind, uint32_t code) {
  uint32_t r[2] = {kind, code};
  (void)write_full(fd, r, sizeof r);
}

/* ---- the session: one command, its caller's stdio, its exit status -------- */

/* The effective capabilities of a process, as /proc shows them; "" if unread. */
static void cap_eff(pid_t pid, char *out, size_t len) {
  char path[64], line[256];
  out[0] = '\0';
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "CapEff:", 7) == 0) {
      size_t n = strcspn(line + 7, "\n");
      if (n >= len) n = len - 1;
      memcpy(out, line + 7, n);
      out[n] = '\0';
      break;
    }
  fclose(f);
}

struct request {
  uint32_t flags, mask;
  char **argv, **envp;
  int fds[4]; /* stdin, stdout, stderr, working directory */
};

/* The request and its four descriptors; -1 on a malformed one. */
static int read_request(int c, struct request *rq) {
  uint32_t len;
  union {
    char buf[CMSG_SPACE(4 * sizeof(int))];
    struct cmsghdr align;
  } u;
  struct iovec iov = {.iov_base = &len, .iov_len = sizeof len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
  ssize_t r;
  do r = recvmsg(c, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  while (r < 0 && errno == EINTR);
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  if (r != (ssize_t)sizeof len || !cm || cm->cmsg_type != SCM_RIGHTS ||
      cm->cmsg_len != CMSG_LEN(4 * sizeof(int)) || (msg.msg_flags & MSG_CTRUNC))
    return -1;
  memcpy(rq->fds, CMSG_DATA(cm), sizeof rq->fds);
  if (len < 16 || len > MAX_REQUEST) return -1;
  char *buf = malloc(len + 1);
  if (!buf || read_full(c, buf, len) != 0) return -1;
  buf[len] = '\0';
  uint32_t h[4];
  memcpy(h, buf, sizeof h);
  rq->flags = h[0];
  rq->mask = h[1];
  if (h[2] == 0 || h[2] > MAX_WORDS || h[3] > MAX_WORDS) return -1;
  char **words = calloc((size_t)h[2] + h[3] + 2, sizeof(char *));
  if (!words) return -1;
  char *p = buf + 16, *end = buf + len;
  for (uint32_t i = 0; i < h[2] + h[3]; i++) {
    char *nul = memchr(p, '\0', (size_t)(end - p));
    if (!nul) return -1;
    words[i + (i >= h[2])] = p; /* argv, NULL, envp, NULL */
    p = nul + 1;
  }
  rq->argv = words;
  rq->envp = words + h[2] + 1;
  return 0;
}

/* In the command's child: the caller's user, groups, stdio, directory; then exec. */
static void start_command(const struct request *rq, const struct ucred *peer, const gid_t *groups,
                          int ngroups) {
  sigset_t none;
  sigemptyset(&none);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  sigprocmask(SIG_SETMASK, &none, NULL);
  setsid();
  for (int i = 0; i < 3; i++)
    if (dup2(rq->fds[i], i) < 0) _exit(126);
  if (rq->flags & FLAG_TTY) (void)ioctl(0, TIOCSCTTY, 0); /* the terminal the client gave up */
  if (fchdir(rq->fds[3]) != 0 && chdir("/") != 0) _exit(126);
  umask((mode_t)rq->mask & 0777);
  if (peer->uid != getuid() || peer->gid != getgid() || ngroups >= 0) {
    if ((ngroups >= 0 && setgroups((size_t)ngroups, groups) != 0) || setgid(peer->gid) != 0 ||
        setuid(peer->uid) != 0) {
      say("cannot take the caller's user and groups: %s", strerror(errno));
      _exit(126);
    }
  }
  environ = rq->envp; /* execvp searches the command's PATH */
  execvp(rq->argv[0], rq->argv);
  int e = errno;
  say("%s: %s", rq->argv[0], strerror(e));
  _exit(e == ENOENT ? 127 : 126);
}

static void session(int c) {
  prctl(PR_SET_NAME, "hpvc-session");
  signal(SIGPIPE, SIG_IGN);
  struct ucred peer;
  socklen_t plen = sizeof peer;
  struct request rq;
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &peer, &plen) != 0 || read_request(c, &rq) != 0)
    _exit(1);
  gid_t groups[MAX_GROUPS];
  if (peer.uid == 0) { /* root: only with every capability the init has */
    char mine[64], theirs[64];
    cap_eff(getpid(), mine, sizeof mine);
    cap_eff(peer.pid, theirs, sizeof theirs);
    unsigned long long m = strtoull(mine, NULL, 16), t = strtoull(theirs, NULL, 16);
    if (!mine[0] || !theirs[0] || (m & ~t) != 0) {
      reply(c, KIND_REFUSED, EPERM);
      _exit(1);
    }
  }
  int ngroups = -1; /* -1: keep the init's own (root's, as the init's) */
  if (peer.uid != 0 || peer.gid != getgid()) {
    socklen_t glen = sizeof groups;
    if (getsockopt(c, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) != 0) {
      reply(c, KIND_REFUSED, (uint32_t)errno);
      _exit(1);
    }
    ngroups = (int)(glen / sizeof(gid_t));
  }
  const int sigs[] = {SIGCHLD};
  int sfd = signal_fd(sigs, 1);
  if (sfd < 0) _exit(1);
  pid_t child = fork();
  if (child < 0) {
    reply(c, KIND_REFUSED, (uint32_t)errno);
    _exit(1);
  }
  if (child == 0) {
    close(c);
    close(sfd);
    start_command(&rq, &peer, groups, ngroups);
  }
  for (int i = 0; i < 4; i++) close(rq.fds[i]);
  int attached = 1;
  for (;;) {
    struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = c, .events = POLLIN}};
    if (poll(p, attached ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      _exit(1);
    }
    if (p[0].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) < 0 && errno != EAGAIN && errno != EINTR) _exit(1);
      int status;
      pid_t w = waitpid(child, &status, WNOHANG);
      if (w == child) {
        if (WIFSIGNALED(status)) reply(c, KIND_SIGNALED, (uint32_t)WTERMSIG(status));
        else reply(c, KIND_EXITED, (uint32_t)WEXITSTATUS(status));
        _exit(0);
      }
    }
    if (attached && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      unsigned char sig;
      ssize_t r = read(c, &sig, 1);
      if (r == 1 && sig > 0 && sig < NSIG) kill(child, sig);
      else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        kill(-child, SIGKILL); /* the caller is gone: so is its command */
        kill(child, SIGKILL);
        attached = 0;
      }
    }
  }
}

/* ---- serve: the node's init ---------------------------------------------- */

int serve(int agent) {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    say("%s%s", "cannot become a child subreaper: ", strerror(errno));
    return 1;
  }
  if (agent && start_agent() != 0) return 1; /* before any descriptor it must not hold */
  const int sigs[] = {SIGCHLD, SIGTERM};
  int sfd = signal_fd(sigs, 2);
  int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  socklen_t salen = sock_addr(&sa);
  if (sfd < 0 || l < 0 || bind(l, (struct sockaddr *)&sa, salen) != 0 || listen(l, 128) != 0) {
    say("%s%s", "cannot listen on @" SOCK_NAME ": ", strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  for (;;) {
    struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = l, .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (p[0].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si && si.ssi_signo == SIGTERM) return 0;
      while (waitpid(-1, NULL, WNOHANG) > 0) {
      } /* sessions, and what commands left behind */
    }
    if (p[1].revents & POLLIN) {
      int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      pid_t pid = fork();
      if (pid == 0) {
        close(l);
        close(sfd);
        session(c);
      }
      close(c);
    }
  }
}
