/* hpvc SPANK plugin: shared declarations (see docs/slurm.md).
 *
 * Mechanism only: the plugin parses its plugstack.conf arguments, runs hpvc's
 * node commands, and moves each task into the namespaces and cgroups hpvc
 * names. Every decision (which virtual node a task runs in, what a site
 * allows, how the cluster is split over the job's hosts) is made by
 * `hpvc node ...` in Python. One file per SPANK context, like NVIDIA pyxis.
 */
#ifndef HPVC_SPANK_H
#define HPVC_SPANK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <slurm/spank.h>

#define HPVC_SPEC_ENV "HPVC_SPEC_B64"
#define HPVC_SPEC_PATH_ENV "HPVC_SPEC"
#define HPVC_MAX_TASKS 1024
#define HPVC_MAX_CGROUPS 32
#define HPVC_MAX_ENV 64 /* hpvc's own and an imported image's Env (48 at most) */
#define HPVC_MAX_SITE 12

/* plugstack.conf arguments (args.c) */
struct hpvc_config {
	char hpvc[4096];      /* the hpvc executable */
	char state_dir[4096]; /* HPVC_STATE_DIR for the node commands (%h expanded) */
	char image_dir[4096]; /* HPVC_IMAGE_DIR, "" = under the state directory (%h expanded) */
	char *site[HPVC_MAX_SITE]; /* policy passed on as --site key=value */
	int nsite;
	int timeout;          /* seconds `hpvc node up` may take */
};

int hpvc_config_parse(struct hpvc_config *cfg, int ac, char **av);
/* The environment of the node commands run as root: state and image dir,
 * PATH, LC_ALL and one optional extra "K=V" (NULL for none), NULL-ended. */
#define HPVC_ROOT_ENV 6
void hpvc_root_env(const struct hpvc_config *cfg, char *state, size_t ssize, char *images,
		   size_t isize, char *extra, char *env[HPVC_ROOT_ENV]);
void hpvc_config_free(struct hpvc_config *cfg);
/* Does the site keep jobs' checkpoints (a checkpoints= argument)? */
int hpvc_keeps_checkpoints(const struct hpvc_config *cfg);
/* Its checkpoints= folder (jobs' cuts in <folder>/<job id>), or NULL. */
const char *hpvc_checkpoints_dir(const struct hpvc_config *cfg);
/* The policy arguments as "--site" "k=v" pairs into argv from k on; the new k. */
int hpvc_site_argv(const struct hpvc_config *cfg, char **argv, int k);

/* The user's --hpvc=SPEC and --hpvc-checkpoint=SECONDS (plugin.c; 0: none) */
extern char *hpvc_spec_arg;
extern unsigned hpvc_checkpoint_every;
/* The batch step, from slurm_spank_init (root, before privileges drop):
 * HPVC_RESTORED=1 in the batch script's environment when the job's shares will
 * come back from a checkpoint (remote.c). */
int hpvc_batch_restored(spank_t sp, const struct hpvc_config *cfg);

/* Running hpvc (run.c): argv with a NULL end. Captures stdout into *out
 * (malloc'ed, NUL ended); each stderr line is logged with slurm_error("hpvc:
 * ..."). Returns the exit status (0 = success), or -1 if it could not run,
 * was killed, timed out or could not be waited for. Every child starts with
 * no file descriptor above 2 and default signal handling.
 *
 * With as_root the child sets all its ids to root first (user_init runs with
 * the user's effective ids), starts in "/" with umask 022, and its
 * environment is exactly env (hpvc_root_env): nothing of slurmd's,
 * slurmstepd's or the user's. Without, it keeps the caller's (the user's)
 * environment, directory and ids, with the env entries added. */
int hpvc_run(char *const argv[], char *const env[], int timeout_s, int as_root, char **out);
/* Close every file descriptor above 2 (close_range; a loop where the kernel
 * lacks it): what hpvc's children and the task relay start with (run.c). */
void hpvc_close_above_stderr(void);
extern double hpvc_progress_after; /* run.c: -1, or show hpvc_run's progress after s */
/* Seconds on the monotonic clock (run.c). */
double hpvc_now(void);

/* Contexts */
int hpvc_local_post_opt(spank_t sp, const struct hpvc_config *cfg);   /* local.c */
int hpvc_local_user_init(spank_t sp, const struct hpvc_config *cfg);  /* local.c */
int hpvc_remote_user_init(spank_t sp, const struct hpvc_config *cfg); /* remote.c */
int hpvc_task_join(spank_t sp);                                        /* task.c */
void hpvc_task_chdir(void); /* task.c: task_init, as the user: the image's WorkingDir */
int hpvc_job_epilog(spank_t sp, const struct hpvc_config *cfg);       /* epilog.c */
/* --mpi=pmix*: one forwarder per step on this host from 127.0.0.1:<port of the
 * step's PMIx server> inside each container node's network to the host's
 * (pmixfwd.c; task_post_fork in slurmstepd, once per step). 0, or -1. */
int hpvc_pmix_forward(spank_t sp);
/* task_init of a container task with --pty: the program gets a pty of the
 * node's own; this process stays to copy between it and slurmstepd's pty
 * and exits as the program did (ptyrelay.c). 0 (the program's way), or -1. */
int hpvc_task_tty(spank_t sp);
/* Exit as a waited-for child did: its exit code (128 for neither), or
 * raise the signal that killed it, unblocked and at its default (ptyrelay.c). */
void hpvc_exit_as(int status) __attribute__((noreturn));

/* VM nodes (vm.c): connect to the node's agent as root (task_init_privileged),
 * then relay the task through it as the user (task_init; does not return
 * when it relays). */
struct hpvc_join;
int hpvc_vm_connect(spank_t sp, const struct hpvc_join *j);
int hpvc_vm_task(spank_t sp);

/* Join records per node slot, from `hpvc node up` or its cache (join.c; taken
 * by remote.c, read by task.c and vm.c) */
struct hpvc_join {
	int used;
	pid_t pid;
	unsigned long long start; /* the node process's start time (field 22 of /proc/PID/stat) */
	char ns[128];   /* comma list: cgroup,ipc,uts,pid,mnt[,net] */
	int nsflags;    /* the same as CLONE_NEW* flags */
	char node[64];
	char *cgroups[HPVC_MAX_CGROUPS];
	int ncgroups;
	char *env[HPVC_MAX_ENV];
	int nenv;
	int vm;         /* a VM node: tasks run through its agent at ip */
	char ip[64];
	char *key;      /* a VM node: the file of its agent's key (root's), or NULL */
	char *workdir;  /* where a task starts when the node lacks the job's directory
			 * (an imported image's WorkingDir), or NULL: "/" */
};
extern struct hpvc_join hpvc_joins[HPVC_MAX_TASKS];
extern int hpvc_slots; /* local task t joins hpvc_joins[t % hpvc_slots] */
int hpvc_parse_joins(const char *text);
void hpvc_free_joins(void);
/* Parse text (freed) into hpvc_joins and hpvc_slots; slots must be 0..n-1
 * without holes. On failure nothing is kept, and unless quiet the error names
 * where the records came from. 0, or -1. */
int hpvc_use_joins(char *text, const char *from, int quiet);
/* Is every node's process still the one its record names (PID and start time)? */
int hpvc_joins_alive(void);
/* The cached join records of this host's share of job (index: its place in
 * the job's hosts; mpi: SLURM_MPI_TYPE), malloc'ed, or NULL when there is no
 * cache that can be trusted. */
char *hpvc_read_join_cache(const struct hpvc_config *cfg, uint32_t job, int index, const char *mpi);
/* The start time of process pid (field 22 of /proc/PID/stat, clock ticks
 * after boot) into *start; -1 if it does not exist or cannot be read. */
int hpvc_proc_start(pid_t pid, unsigned long long *start);

#endif
