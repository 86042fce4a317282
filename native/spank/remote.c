/* slurmstepd (remote context, user_init: once per step on each host, after the
 * step's I/O is connected, so errors reach the user's terminal):
 * `hpvc node up`, run as root, brings this host's share of the job's virtual
 * cluster up (or finds it running) and prints how each local task joins its
 * node (the join records, join.c; a running share's come from its cache). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <slurm/slurm.h>

#include "hpvc_spank.h"

/* This host's part of the step, as `hpvc node up` is told it. */
struct share {
	uint32_t job;
	int index, hosts;   /* this host's place in the job's node list, and its length */
	char *cores;        /* the job's cores here (Slurm's), NULL if unknown */
	char mpi[64];       /* SLURM_MPI_TYPE, "" if unset */
	char job_nodes[8192]; /* the job's hosts, from slurmctld */
	uid_t uid;          /* the job's user (S_JOB_UID), (uid_t)-1 if unknown */
	gid_t gid;
	uint32_t restarts;  /* Slurm's restart count: a requeued job's is above 0 */
};

/* The job's and the step's node lists as slurmctld has them (n[1-3]), never
 * the SLURM_JOB_NODELIST / SLURM_STEP_NODELIST of the task's environment:
 * that environment is the user's (srun sends it, a user may send any), and a
 * forged list would pick the job's VXLAN peers and, made longer, a subnet as
 * large as the pool. slurmstepd runs as root and asks the controller. */
static int slurm_lists(uint32_t job, uint32_t step, char *job_nodes, size_t size,
		       char *step_nodes, size_t step_size)
{
	job_info_msg_t *ji = NULL;
	job_step_info_response_msg_t *si = NULL;
	int rc = -1;
	if (slurm_load_job(&ji, job, SHOW_ALL) != SLURM_SUCCESS || ji == NULL ||
	    ji->record_count < 1 || ji->job_array[0].nodes == NULL) {
		slurm_error("hpvc: job %u: cannot ask slurmctld for the job's hosts: %s", job,
			    slurm_strerror(slurm_get_errno()));
		goto out;
	}
	if (slurm_get_job_steps(0, job, step, &si, SHOW_ALL) != SLURM_SUCCESS || si == NULL ||
	    si->job_step_count < 1 || si->job_steps[0].nodes == NULL) {
		slurm_error("hpvc: job %u: cannot ask slurmctld for step %u's hosts: %s", job, step,
			    slurm_strerror(slurm_get_errno()));
		goto out;
	}
	int a = snprintf(job_nodes, size, "%s", ji->job_array[0].nodes);
	int b = snprintf(step_nodes, step_size, "%s", si->job_steps[0].nodes);
	if (a < 0 || (size_t)a >= size || b < 0 || (size_t)b >= step_size) {
		slurm_error("hpvc: job %u: its node list is too long", job);
		goto out;
	}
	rc = 0;
out:
	if (ji)
		slurm_free_job_info_msg(ji);
	if (si)
		slurm_free_job_step_info_response_msg(si);
	return rc;
}

/* This host's name (the step's node list at this node's id: SLURMD_NODENAME
 * is the environment's too, and an srun inside a batch script inherits the
 * batch host's), then its place in the job's list job_nodes. */
static int job_index(uint32_t job, uint32_t step, uint32_t nodeid, char *job_nodes, size_t size,
		     int *index, int *hosts)
{
	char step_nodes[8192], name[256] = "";
	if (slurm_lists(job, step, job_nodes, size, step_nodes, sizeof(step_nodes)) < 0)
		return -1;
	hostlist_t hl = slurm_hostlist_create(step_nodes);
	char *h = NULL;
	for (uint32_t i = 0; hl && i <= nodeid; i++) {
		free(h);
		h = slurm_hostlist_shift(hl);
	}
	if (h != NULL)
		snprintf(name, sizeof(name), "%s", h);
	free(h);
	if (hl)
		slurm_hostlist_destroy(hl);
	hl = slurm_hostlist_create(job_nodes);
	if (hl == NULL)
		return -1;
	*hosts = slurm_hostlist_count(hl);
	*index = name[0] ? slurm_hostlist_find(hl, name) : -1;
	slurm_hostlist_destroy(hl);
	if (*index < 0) {
		slurm_error("hpvc: node '%s' is not in the job's node list %s", name, job_nodes);
		return -1;
	}
	return 0;
}

/* HPVC_SPEC_B64=<the job's spec> into spec (size bytes), for the environment
 * of `hpvc node up`. */
static int job_spec(spank_t sp, char *spec, size_t size)
{
	memcpy(spec, HPVC_SPEC_ENV "=", sizeof(HPVC_SPEC_ENV));
	char *value = spec + sizeof(HPVC_SPEC_ENV);
	spank_err_t got = spank_getenv(sp, HPVC_SPEC_ENV, value, (int)(size - sizeof(HPVC_SPEC_ENV)));
	if (got == ESPANK_NOSPACE) {
		slurm_error("hpvc: the job's %s is too long (a spec is at most 64 KiB)", HPVC_SPEC_ENV);
		return -1;
	}
	if (got != ESPANK_SUCCESS) {
		slurm_error("hpvc: the job's environment has no %s (was it submitted with --export=NONE?)",
			    HPVC_SPEC_ENV);
		return -1;
	}
	return 0;
}

/* Slurm's restart count: the item where Slurm sets it (the batch step), else
 * the job's SLURM_RESTART_COUNT (a user who forges it only makes hpvc look
 * for checkpoints of this job, which a job that never ran has none of). */
static uint32_t restart_count(spank_t sp)
{
	uint32_t n = 0;
	char text[16];
	if (spank_get_item(sp, S_SLURM_RESTART_COUNT, &n) == ESPANK_SUCCESS && n > 0)
		return n;
	if (spank_getenv(sp, "SLURM_RESTART_COUNT", text, sizeof(text)) != ESPANK_SUCCESS)
		return 0;
	return (uint32_t)strtoul(text, NULL, 10);
}

/* Where this host stands in the step's job: its place in the job's hosts,
 * its cores and the MPI type. */
static int find_share(spank_t sp, uint32_t step, uint32_t nodeid, struct share *s)
{
	if (job_index(s->job, step, nodeid, s->job_nodes, sizeof(s->job_nodes), &s->index,
		      &s->hosts) < 0)
		return -1;
	if (spank_get_item(sp, S_JOB_ALLOC_CORES, &s->cores) != ESPANK_SUCCESS)
		s->cores = NULL;
	if (spank_getenv(sp, "SLURM_MPI_TYPE", s->mpi, sizeof(s->mpi)) != ESPANK_SUCCESS)
		s->mpi[0] = '\0';
	if (spank_get_item(sp, S_JOB_UID, &s->uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &s->gid) != ESPANK_SUCCESS)
		s->uid = (uid_t)-1;
	s->restarts = restart_count(sp);
	return 0;
}

/* The command line of `hpvc node up` for a share, with the numbers it
 * passes as text. */
struct node_up {
	char *argv[32 + 2 * HPVC_MAX_SITE];
	char job[16], index[16], hosts[16], mem[32], uid[16], gid[16], restarts[16], every[16];
};

/* mem: the job's memory on this host (MB, 0 if unknown), for hpvc to refuse
 * a share that does not fit in it before it changes anything. */
static void node_up_argv(const struct hpvc_config *cfg, struct share *s, uint64_t mem,
			 struct node_up *u)
{
	snprintf(u->job, sizeof(u->job), "%u", s->job);
	snprintf(u->index, sizeof(u->index), "%d", s->index);
	snprintf(u->hosts, sizeof(u->hosts), "%d", s->hosts);
	char **argv = u->argv;
	int k = 0;
	argv[k++] = (char *)cfg->hpvc;
	argv[k++] = "node";
	argv[k++] = "up";
	argv[k++] = "--verbose"; /* progress, shown to the user when it is slow (run.c) */
	argv[k++] = "--job";
	argv[k++] = u->job;
	argv[k++] = "--index";
	argv[k++] = u->index;
	argv[k++] = "--hosts";
	argv[k++] = u->hosts;
	if (s->cores && s->cores[0]) {
		argv[k++] = "--cpus";
		argv[k++] = s->cores;
	}
	if (s->mpi[0]) {
		argv[k++] = "--mpi";
		argv[k++] = s->mpi;
	}
	if (mem > 0 && mem < INT64_MAX) {
		snprintf(u->mem, sizeof(u->mem), "%llu", (unsigned long long)mem);
		argv[k++] = "--mem-mib";
		argv[k++] = u->mem;
	}
	/* The job's user, from Slurm: what runs in the nodes for the job (Spark's
	 * daemons) runs as this user, and the NFS share is charged to it. */
	if (s->uid != (uid_t)-1) {
		snprintf(u->uid, sizeof(u->uid), "%u", (unsigned)s->uid);
		snprintf(u->gid, sizeof(u->gid), "%u", (unsigned)s->gid);
		argv[k++] = "--uid";
		argv[k++] = u->uid;
		argv[k++] = "--gid";
		argv[k++] = u->gid;
	}
	/* The job's hosts, for wiring this host's share to the others'. */
	if (s->job_nodes[0]) {
		argv[k++] = "--nodelist";
		argv[k++] = s->job_nodes;
	}
	/* A requeued job's shares come back from its last checkpoint; the first
	 * host takes one every --hpvc-checkpoint seconds (docs/checkpoint.md). */
	snprintf(u->restarts, sizeof(u->restarts), "%u", s->restarts);
	snprintf(u->every, sizeof(u->every), "%u", hpvc_checkpoint_every);
	argv[k++] = "--restarts";
	argv[k++] = u->restarts;
	argv[k++] = "--checkpoint-every";
	argv[k++] = u->every;
	k = hpvc_site_argv(cfg, argv, k);
	argv[k] = NULL;
}

/* A share that takes longer than this to come up (VM guests booting) shows
 * the user its progress; a quicker one (containers) says nothing. */
#define PROGRESS_AFTER_S 1.0

/* Run `hpvc node up` as root with the spec in its environment and take the
 * join records it prints. */
static int node_up(spank_t sp, const struct hpvc_config *cfg, struct share *s, char *spec)
{
	uint64_t mem = 0;
	if (spank_get_item(sp, S_JOB_ALLOC_MEM, &mem) != ESPANK_SUCCESS)
		mem = 0;
	struct node_up u;
	node_up_argv(cfg, s, mem, &u);
	char state[4200], images[4200], *env[HPVC_ROOT_ENV];
	hpvc_root_env(cfg, state, sizeof(state), images, sizeof(images), spec, env);
	char *out = NULL;
	double t0 = hpvc_now();
	hpvc_progress_after = PROGRESS_AFTER_S;
	int rc = hpvc_run(u.argv, env, cfg->timeout, 1, &out);
	hpvc_progress_after = -1;
	double took = hpvc_now() - t0;
	if (rc != 0) {
		free(out);
		slurm_error("hpvc: job %u: the virtual nodes of host %d did not come up", s->job, s->index);
		return -1;
	}
	if (hpvc_use_joins(out, "`hpvc node up`", 0) < 0)
		return -1;
	/* How long `hpvc node up` took, start to exit, for the step's tasks
	 * (hpvc bench slurm breaks the first step down by it); not cached. */
	char timed[64];
	snprintf(timed, sizeof(timed), "HPVC_NODE_UP_S=%.3f", took);
	for (int t = 0; t < hpvc_slots; t++) {
		char *kv = hpvc_joins[t].nenv < HPVC_MAX_ENV ? strdup(timed) : NULL;
		if (kv != NULL)
			hpvc_joins[t].env[hpvc_joins[t].nenv++] = kv;
	}
	return 0;
}

int hpvc_remote_user_init(spank_t sp, const struct hpvc_config *cfg)
{
	static struct share s;
	uint32_t step = 0, nodeid = 0;
	memset(&s, 0, sizeof(s));
	if (hpvc_spec_arg == NULL)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &s.job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NODEID, &nodeid) != ESPANK_SUCCESS) {
		slurm_error("hpvc: cannot read the step's job id, step id or node id");
		return -1;
	}
	/* The batch script, the extern and the interactive step stay on the host:
	 * they must reach slurmctld and run srun. Steps run in the virtual nodes. */
	if (step >= SLURM_INTERACTIVE_STEP)
		return 0;
	/* A spec is at most 64 KiB (hpvc node check), 88 KiB in base64. */
	static char spec[96 * 1024];
	if (job_spec(sp, spec, sizeof(spec)) < 0 || find_share(sp, step, nodeid, &s) < 0)
		return -1;
	/* The cache only saves starting hpvc: anything odd about it (an older
	 * format, a node process that is gone or not the same) means asking
	 * `hpvc node up`, which checks the share and writes the cache anew. */
	char *cached = hpvc_read_join_cache(cfg, s.job, s.index, s.mpi);
	if (cached != NULL && hpvc_use_joins(cached, "the running share", 1) == 0 && hpvc_joins_alive())
		return 0;
	hpvc_free_joins();
	hpvc_slots = 0;
	return node_up(sp, cfg, &s, spec);
}

/* The batch step may not carry the job's --hpvc option, and its restart count
 * is not known yet when SPANK runs (Slurm 22.05: S_SLURM_RESTART_COUNT is 0 and
 * SLURM_RESTART_COUNT is set only as the script starts; seen in the test
 * cluster's slurmd logs): a job whose folder in the site's checkpoints holds
 * anything ran before. Only then is hpvc asked (as root: the folder is root's)
 * whether a complete cut is there, which the shares will be restored from. */
int hpvc_batch_restored(spank_t sp, const struct hpvc_config *cfg)
{
	uint32_t job = 0;
	const char *root = hpvc_checkpoints_dir(cfg);
	char dir[4200];
	struct stat st;
	if (root == NULL || spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
		return 0;
	snprintf(dir, sizeof(dir), "%s/%u", root, job);
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return 0; /* a first run: nothing to ask, no Python started */
	char sjob[16], state[4200], images[4200], *env[HPVC_ROOT_ENV];
	char *argv[8 + 2 * HPVC_MAX_SITE];
	snprintf(sjob, sizeof(sjob), "%u", job);
	int k = 0;
	argv[k++] = (char *)cfg->hpvc;
	argv[k++] = "node";
	argv[k++] = "checkpoint-latest";
	argv[k++] = "--job";
	argv[k++] = sjob;
	k = hpvc_site_argv(cfg, argv, k);
	argv[k] = NULL;
	hpvc_root_env(cfg, state, sizeof(state), images, sizeof(images), NULL, env);
	char *out = NULL;
	int rc = hpvc_run(argv, env, cfg->timeout, 1, &out);
	int found = rc == 0 && out != NULL && out[0] == '/';
	free(out);
	if (found && spank_setenv(sp, "HPVC_RESTORED", "1", 1) != ESPANK_SUCCESS)
		slurm_error("hpvc: job %u: cannot set HPVC_RESTORED in the batch script", job);
	return 0;
}
