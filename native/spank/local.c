/* srun, sbatch, salloc (local and allocator contexts), as the submitting user:
 * `hpvc node check SPEC` reads and checks the spec now, so a bad spec stops
 * the job before it is queued; the spec then travels in the job's
 * environment (HPVC_SPEC_B64), so the hosts never read a user's file as root.
 *
 * An srun that made a new job checks once more once the allocation exists
 * (local_user_init, before any step starts): whether the spec's biggest host
 * share fits in the memory Slurm gave the job on a host. `hpvc node check`
 * printed that share's MiB for every host count ("mem N1 N2 ..."), so this
 * check starts no second hpvc. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <slurm/slurm.h>

#include "hpvc_spank.h"

static char spec_path[PATH_MAX]; /* the checked spec (realpath) */
static int in_allocation;        /* srun started inside an existing job */
#define HPVC_MAX_ROW 1024        /* policy.MAX_MEMORY_ROW */
static uint64_t mem_row[HPVC_MAX_ROW]; /* MiB of the biggest share of an h-host job: [h-1] */
static int mem_hosts;                  /* entries in mem_row */

/* "mem N1 N2 ..." from `hpvc node check`; anything odd leaves the row empty
 * (the hosts' `hpvc node up --mem-mib` still checks). */
static void parse_mem_row(const char *line)
{
	mem_hosts = 0;
	if (strncmp(line, "mem ", 4) != 0)
		return;
	const char *p = line + 4;
	while (*p && mem_hosts < HPVC_MAX_ROW) {
		char *end = NULL;
		unsigned long long v = strtoull(p, &end, 10);
		if (end == p || (*end != ' ' && *end != '\0' && *end != '\n')) {
			mem_hosts = 0;
			return;
		}
		mem_row[mem_hosts++] = v;
		p = end;
		while (*p == ' ')
			p++;
		if (*p == '\n')
			break;
	}
}

int hpvc_local_post_opt(spank_t sp, const struct hpvc_config *cfg)
{
	char real[PATH_MAX];
	if (hpvc_spec_arg == NULL)
		return 0;
	if (realpath(hpvc_spec_arg, real) == NULL) {
		slurm_error("hpvc: --hpvc=%s: no such file (give the path of a cluster spec)", hpvc_spec_arg);
		return -1;
	}
	snprintf(spec_path, sizeof(spec_path), "%s", real);
	in_allocation = getenv("SLURM_JOB_ID") != NULL || getenv("SLURM_JOBID") != NULL;
	/* An srun inside an sbatch/salloc allocation inherits the checked spec. */
	const char *have = getenv(HPVC_SPEC_PATH_ENV);
	if (have != NULL && strcmp(have, real) == 0 && getenv(HPVC_SPEC_ENV) != NULL)
		return 0;

	char *argv[8 + 2 * HPVC_MAX_SITE];
	int k = 0;
	argv[k++] = (char *)cfg->hpvc;
	argv[k++] = "node";
	argv[k++] = "check";
	argv[k++] = real;
	for (int i = 0; i < cfg->nsite; i++) {
		argv[k++] = "--site";
		argv[k++] = cfg->site[i];
	}
	argv[k] = NULL;
	char *out = NULL;
	double t0 = hpvc_now();
	int rc = hpvc_run(argv, NULL, cfg->timeout, 0, &out);
	char took[32];
	snprintf(took, sizeof(took), "%.3f", hpvc_now() - t0);
	if (rc != 0) {
		free(out);
		if (rc > 0)
			slurm_error("hpvc: the spec %s was refused; no job was started", real);
		return -1;
	}
	size_t first = strcspn(out, "\r\n");
	if (out[first] != '\0')
		parse_mem_row(out + first + 1 + (out[first] == '\r' && out[first + 1] == '\n'));
	out[first] = '\0';
	if (out[0] == '\0') {
		free(out);
		slurm_error("hpvc: %s node check printed nothing", cfg->hpvc);
		return -1;
	}
	/* srun/sbatch/salloc pass their environment on to the job (spank_setenv
	 * works in remote context only). */
	(void)sp;
	/* HPVC_CHECK_S: how long the check took (hpvc bench slurm's breakdown). */
	int err = setenv(HPVC_SPEC_ENV, out, 1) != 0 || setenv(HPVC_SPEC_PATH_ENV, real, 1) != 0 ||
		  setenv("HPVC_CHECK_S", took, 1) != 0;
	free(out);
	if (err) {
		slurm_error("hpvc: cannot pass the spec on in the job's environment");
		return -1;
	}
	return 0;
}

/* The job's memory on one host in MiB (0 = not limited): pn_min_memory is
 * per node, or per CPU with MEM_PER_CPU (then times the CPUs of the host
 * with most: a refusal must hold wherever the biggest share lands; each
 * host's `hpvc node up --mem-mib` checks its own share exactly). */
static uint64_t job_memory(slurm_job_info_t *ji)
{
	uint64_t per = ji->pn_min_memory;
	if (per == 0 || per == NO_VAL64 || per == INFINITE64)
		return 0;
	if (!(per & MEM_PER_CPU))
		return per;
	per &= ~MEM_PER_CPU;
	int cpus = 0;
	for (uint32_t i = 0; ji->job_resrcs && i < ji->num_nodes; i++) {
		int c = slurm_job_cpus_allocated_on_node_id(ji->job_resrcs, (int)i);
		if (c > cpus)
			cpus = c;
	}
	return cpus > 0 ? per * (uint64_t)cpus : 0;
}

int hpvc_local_user_init(spank_t sp, const struct hpvc_config *cfg)
{
	/* Steps of an existing allocation: its first step's `hpvc node up`
	 * checked (or checks) the memory on every host; no Python per step. */
	if (hpvc_spec_arg == NULL || spec_path[0] == '\0' || in_allocation)
		return 0;
	uint32_t job = 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS || job == 0)
		return 0;
	job_info_msg_t *msg = NULL;
	if (slurm_load_job(&msg, job, SHOW_DETAIL) != SLURM_SUCCESS || msg == NULL ||
	    msg->record_count < 1) {
		/* Not fatal: `hpvc node up` on each host refuses before any change. */
		slurm_verbose("hpvc: cannot load job %u (%s): its memory is checked on the hosts", job,
			      slurm_strerror(slurm_get_errno()));
		if (msg != NULL)
			slurm_free_job_info_msg(msg);
		return 0;
	}
	uint64_t mem = job_memory(&msg->job_array[0]);
	uint32_t nodes = msg->job_array[0].num_nodes;
	slurm_free_job_info_msg(msg);
	if (mem == 0 || nodes == 0)
		return 0;

	/* More hosts than nodes: `hpvc node up` says so on the hosts. */
	if ((int)nodes > mem_hosts || mem_row[nodes - 1] <= mem)
		return 0;
	unsigned long long need = (unsigned long long)mem_row[nodes - 1];
	slurm_error("hpvc: --mem: the job has %llu MiB per host: the virtual nodes of its biggest host share need %llu MiB (ask for --mem=%lluM or give the nodes less memory)",
		    (unsigned long long)mem, need, need);
	slurm_error("hpvc: job %u: the spec %s does not fit the job's %u host(s) with %llu MiB each; no step was started",
		    job, spec_path, nodes, (unsigned long long)mem);
	return -1;
}
