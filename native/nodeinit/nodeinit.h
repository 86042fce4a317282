/* hpvc-nodeinit: the init of a container node (first made for nodes sharing
 * their cluster's PID namespace, locality = "shm"; every new container node's
 * since 2026-11-28), and the client that starts commands under it.
 * One static binary in two roles (docs/containers.md "Commands under the
 * node's init", docs/checkpoint.md "Nodes sharing namespaces").
 *
 * Why: co-resident nodes join one PID namespace, owned by the cluster's
 * holder. crun exec starts a command by joining the node's namespaces from
 * outside and forking, so a job the command leaves running in the background
 * is re-parented to the namespace's init, the holder: in no node's process
 * tree. CRIU dumps a process tree, so such a node could not be checkpointed
 * whole. Here every command of the node is started by the node's own init,
 * which is also a child subreaper: whatever a command leaves behind stays
 * below the init, one tree per node.
 *
 *   hpvc-nodeinit serve        the node's init (crun starts it). Listens on
 *                              the abstract Unix socket "@hpvc-nodeinit" of the
 *                              node's network namespace (each node has its own,
 *                              so a node reaches only its own init), forks a
 *                              session per connection, reaps whatever is
 *                              re-parented to it, exits 0 on SIGTERM.
 *   hpvc-nodeinit serve --agent  the same, with the node's hpvc-agent on eth0
 *                              started first (agent.c), for mpirun inside the
 *                              nodes; the binary called as hpvc-rsh (its
 *                              bind at /dev/hpvc-rsh) is native/agent's rsh.c.
 *   hpvc-nodeinit run ARGV...  the client (what `crun exec` runs): hands the
 *                              init its argv, environment, working directory,
 *                              umask and stdin/stdout/stderr (SCM_RIGHTS, so
 *                              the command writes to the caller's own pipes or
 *                              terminal, as under crun exec), passes on
 *                              SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
 *                              SIGUSR2, and exits as the command did (128+N for
 *                              a signal N; 127 no such command, 126 not
 *                              executable, as a shell says).
 *
 * The session runs the command as the connecting process's user, groups
 * (SO_PEERCRED, SO_PEERGROUPS) and, for root, only if the caller holds all
 * the init's capabilities: nobody gets more from the init than they have.
 * With a terminal (crun exec --tty) the client gives its controlling terminal
 * up and the command takes it, in a session of its own, so the terminal's
 * Ctrl-C and window size reach the command. A client that goes away before
 * its command ends takes the command's process group with it (SIGKILL).
 *
 * Request (client -> init): u32 length, then that many bytes: u32 flags
 * (1: terminal), u32 umask, u32 argc, u32 envc, then argc + envc
 * NUL-terminated strings; fds 0, 1, 2 and the working directory (O_PATH) ride
 * on the first message. Then one byte per signal to pass on. Reply (init ->
 * client): u32 kind (0 exited, 1 killed by a signal, 2 refused), u32 code.
 */
#ifndef HPVC_NODEINIT_H
#define HPVC_NODEINIT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#define SOCK_NAME "hpvc-nodeinit"
#define MAX_REQUEST (8u << 20)  /* argv + environment: well over ARG_MAX */
#define MAX_WORDS 65536
#define MAX_GROUPS 1024
#define FLAG_TTY 1u
#define KIND_EXITED 0u
#define KIND_SIGNALED 1u
#define KIND_REFUSED 2u

extern char **environ;
__attribute__((format(printf, 1, 2))) void say(const char *fmt, ...);
socklen_t sock_addr(struct sockaddr_un *sa);
int read_full(int fd, void *buf, size_t n);
int write_full(int fd, const void *buf, size_t n);
int signal_fd(const int *sigs, int n);
int serve(int agent);
int start_agent(void);
int hpvc_rsh_main(int argc, char **argv);
int run(int argc, char **argv);

#endif
