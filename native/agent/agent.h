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

#endif
