/* hpvc-agent: how a command runs inside a virtual machine of a Slurm job.
 *
 * The guest's init starts an agent listening on TCP port HPVC_AGENT_PORT of
 * the node's cluster address. A client (the SPANK plugin's task relay on the
 * host, or hpvc-rsh in another guest of the job) connects from a reserved
 * port (below 1024: only root can bind one, on the host as in a guest) and
 * from an address of the cluster's subnet, and proves it holds the job's
 * secret (auth.c: a challenge and an HMAC answer); the agent refuses anyone
 * else. The port is the first fence (rsh's trust: root on the job's hosts,
 * slurmstepd, and root in the job's own guests, the job's user), the secret
 * the second: it holds where another user can bind a low port. The secret
 * is a file only root reads: in the guest /run/hpvc/agent-key (from QEMU's
 * fw_cfg entry opt/hpvc/agent-key), on the host the cluster's agent.key.
 *
 * Frames both ways: 1 byte type, 4 bytes length (big-endian), payload.
 *   first:           agent 'n' a nonce, client 'h' its answer, agent 'k'
 *                    (go on) or a refusal ('r' line, 'x' end) (auth.c).
 *   client -> agent: 'a' one argv word, 'e' one "K=V", 'd' the working
 *                    directory (a second 'd': where to start when the guest
 *                    lacks the first), 'g' start; then 'i' stdin bytes (length 0:
 *                    end of input) and 's' a signal (1 byte) to the command's
 *                    process group.
 *   agent -> client: 'o' stdout bytes, 'r' stderr bytes, 'x' the end: 2 bytes,
 *                    kind (0 exited, 1 killed by a signal) and the code.
 *   terminal (pty.c, tty.c): client -> agent 't' before 'g': give the command
 *                    a terminal (a pty in the guest; stdout and stderr are then
 *                    one stream, 'o'); payload rows, cols (2 + 2 bytes
 *                    big-endian), then TERM. 'w' after 'g': the window's size
 *                    changed (the same 4 bytes). With a terminal, 's' goes to
 *                    the terminal's foreground job, and an end of input is
 *                    ignored (Ctrl-D is a byte like any other).
 *   channels (chan.c, pmixhs.c): client -> agent 'p' before 'g': the port of
 *                    the step's PMIx server (2 bytes big-endian), 'P' before
 *                    'g': a PMI-2 stream (PMI_FD); agent -> client 'C' channel
 *                    N accepted; both ways 'c' (N, 4 bytes big-endian, then
 *                    data) and 'q' (N closed). Channel 0 is PMI-2's.
 * A client that goes away (its socket closes) takes the command with it:
 * the agent SIGKILLs the command's process group.
 */
#ifndef HPVC_AGENT_H
#define HPVC_AGENT_H

#include <stddef.h>
#include <stdint.h>

#define HPVC_AGENT_PORT 7117
#define HPVC_AGENT_MAX 65536  /* largest payload */
#define HPVC_AGENT_WORDS 4096 /* most argv words, and most environment entries */
#define HPVC_AGENT_KEY_MIN 16  /* bytes of a job's secret: at least */
#define HPVC_AGENT_KEY_MAX 64  /* and at most (hpvc writes 32) */
#define HPVC_AGENT_NONCE 32
#define HPVC_AGENT_KEY_FILE "/run/hpvc/agent-key" /* in the guest, root's alone */
/* In a container node (native/nodeinit): the cluster's agent.key, bound read-only. */
#define HPVC_AGENT_KEY_NODE "/dev/hpvc-agent-key"

/* frames.c */
/* All n bytes, through partial writes and EINTR: 0, or -1. */
int hpvc_write_all(int fd, const void *data, size_t n);
int hpvc_frame_send(int fd, char type, const void *data, uint32_t len);
/* One whole frame into buf (cap bytes): 1, or 0 at a clean end of stream
 * between frames, or -1 (error, bad frame, too long). */
int hpvc_frame_recv(int fd, char *type, unsigned char *buf, uint32_t cap, uint32_t *len);

/* client.c */
/* A TCP connection to ip:port from a reserved local port (root only):
 * the socket, or -1 with errno set. */
int hpvc_agent_connect(const char *ip, int port);
/* Run argv with env (NULL-ended; NULL for none) in cwd, else (the guest lacks
 * it) in fallback (either NULL: none; neither: the agent's default, /root)
 * over a connected socket, relaying stdin (in_fd, -1 for none),
 * stdout, stderr and the signals the client receives (SIGINT, SIGTERM,
 * SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGALRM, SIGTSTP). Returns the
 * exit code (0-255), minus the signal that killed the command, or -256 when
 * the connection ended without an end frame (*why says why). */
int hpvc_agent_run(int sock, char *const argv[], char *const env[], const char *cwd,
		   const char *fallback, int in_fd, const char **why);

/* tty.c (client side of a terminal) */
/* Before hpvc_agent_run: send 't' before 'g' and the window's size changes
 * of tty as 'w' (client.c). */
void hpvc_agent_use_tty(int tty, const char *term);
/* 't' with tty's size and term (NULL: none); 'w' if tty's size changed since
 * the last frame sent (0 when unchanged): 0, or -1. */
int hpvc_tty_send_start(int sock, int tty, const char *term);
int hpvc_tty_send_size(int sock, int tty);
/* hpvc_agent_run with a terminal in the guest: tty (the client's stdin, a
 * terminal) raw for the run and restored after; the same return values. */
int hpvc_agent_run_tty(int sock, char *const argv[], char *const env[], const char *cwd,
		       const char *fallback, int tty, const char *term, const char **why);

/* pty.c (guest only) */
/* A pty pair sized from 't''s payload: the master, the slave in *slave
 * (both close-on-exec), or -1. */
int hpvc_pty_open(int *slave, const unsigned char *size, uint32_t len);
void hpvc_pty_resize(int master, const unsigned char *size, uint32_t len);
/* sig to the terminal's foreground job (and the leader's group for an end). */
void hpvc_pty_signal(int master, int leader, int sig);
/* SIGKILL every process of session sid (the command and the jobs it made). */
void hpvc_pty_kill_session(int sid);

/* auth.c */
/* HMAC-SHA256(key, a || b) into out. */
void hpvc_hmac_sha256(const void *key, size_t klen, const void *a, size_t alen, const void *b,
		      size_t blen, unsigned char out[32]);
/* The secret in path (HPVC_AGENT_KEY_MIN to _MAX bytes, raw): its length,
 * or -1 with errno set. */
int hpvc_agent_read_key(const char *path, unsigned char key[HPVC_AGENT_KEY_MAX]);
/* Agent side, on a new connection: 1 the client proved it holds key (it was
 * told 'k'), 0 it did not (nothing said yet: the caller refuses), -1 the
 * connection failed. A key shorter than HPVC_AGENT_KEY_MIN refuses everyone. */
int hpvc_agent_challenge(int sock, const unsigned char *key, size_t klen);
/* Agent side: "hpvc-agent: refused: WHY" on the client's stderr, exit code 255. */
void hpvc_agent_refuse(int sock, const char *why);
/* Client side, right after connecting: 0 once the agent let us in, -1 (*why
 * says why; the agent's own reason went to stderr). */
int hpvc_agent_login(int sock, const unsigned char *key, size_t klen, const char **why);

/* server.c (guest only) */
/* Listen on ip:HPVC_AGENT_PORT and serve in a child process; accepts only
 * clients in ip/prefix from a reserved port that prove they hold key (klen
 * bytes; none: everyone is refused). The child's PID, or -1. */
int hpvc_agent_start(const char *ip, int prefix, const unsigned char *key, size_t klen);

/* chan.c: Slurm's PMIx / PMI-2 beside a command (docs/slurm.md, "MPI between
 * guests"); one command's channels per process. */
#define HPVC_CHAN_MAX 16
#define HPVC_PMIX_HEAD_MAX 65536 /* a PMIx connection request: at most */
struct pollfd;
/* Relay: the step's PMIx server (PMIX_SERVER_URI*, 127.0.0.1 only) and PMI-2
 * stream (PMI_FD) from the task's env: 0 (also with neither), or -1 (*why). */
int hpvc_chan_host_setup(char *const env[], const char **why);
/* Relay: 'p' and 'P' as set up, before 'g': 0, or -1. */
int hpvc_chan_send_asks(int sock);
/* Agent: a 'p' or 'P' frame read before 'g': 0, or -1 (malformed). */
int hpvc_chan_ask(char type, const unsigned char *p, uint32_t len);
/* Agent, before the fork: the PMIx listener and PMI-2 socketpair asked for,
 * with env (envc entries, room for cap) pointing the command at them: 0, or -1. */
int hpvc_chan_guest_prepare(char **env, int *envc, int cap);
/* Agent, after the fork: the command's PMI-2 end closed here. */
void hpvc_chan_guest_started(void);
/* Both: poll entries (at most HPVC_CHAN_MAX + 1) into fds: how many. */
int hpvc_chan_poll(struct pollfd *fds);
/* Both: after poll, what is ready on them sent to sock: 0, or -1. */
int hpvc_chan_ready(int sock, const struct pollfd *fds, int n);
/* Both: a 'C', 'c' or 'q' frame from the other side: 0, or -1 (malformed). */
int hpvc_chan_frame(int sock, char type, const unsigned char *p, uint32_t len);
/* pmixhs.c: msg (len bytes so far) as a PMIx 4 client's TCP connection
 * request of nspace/rank, its claimed uid and gid made uid, gid in place:
 * 1 whole and good, 0 not whole yet, -1 refused (*why). */
int hpvc_pmix_request_check(unsigned char *msg, uint32_t len, const char *nspace, uint32_t rank,
			    unsigned uid, unsigned gid, const char **why);

#endif
