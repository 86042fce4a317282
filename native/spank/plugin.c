/* hpvc SPANK plugin: entry points, dispatched on the SPANK context.
 *
 *   srun/sbatch/salloc --hpvc=SPEC   (local, allocator)  local.c
 *   srun, allocation made             (local_user_init)   local.c
 *   slurmstepd, once per step         (remote, user_init) remote.c
 *   each task, before exec            (remote)            task.c
 *   each task of a VM node, as user   (remote)            vm.c
 *   slurmd job epilog                 (job_script)        epilog.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <slurm/slurm.h>
#include <string.h>

#include "hpvc_spank.h"

SPANK_PLUGIN(hpvc, 1);

char *hpvc_spec_arg;
unsigned hpvc_checkpoint_every;
static struct hpvc_config config;
static int configured;

/* Slurm passes the plugstack.conf arguments to every callback; not every
 * context calls slurm_spank_init first (the job epilog does not). */
static int configure(int ac, char **av)
{
	if (configured)
		return 0;
	if (hpvc_config_parse(&config, ac, av) < 0)
		return -1;
	configured = 1;
	return 0;
}

static int spec_option(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	if (optarg == NULL || optarg[0] == '\0') {
		slurm_error("hpvc: --hpvc needs a spec file: --hpvc=cluster.toml");
		return -1;
	}
	free(hpvc_spec_arg);
	hpvc_spec_arg = strdup(optarg);
	return hpvc_spec_arg ? 0 : -1;
}

/* --hpvc-checkpoint=SECONDS: the period is checked against the site's
 * checkpoint_min by `hpvc node up` (Python), before anything changes. */
static int checkpoint_option(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	char *end = NULL;
	unsigned long v = optarg ? strtoul(optarg, &end, 10) : 0;
	if (optarg == NULL || end == optarg || *end != '\0' || v < 1 || v > 31536000) {
		slurm_error("hpvc: --hpvc-checkpoint needs seconds between checkpoints: --hpvc-checkpoint=600");
		return -1;
	}
	hpvc_checkpoint_every = (unsigned)v;
	return 0;
}

static struct spank_option checkpoint_opt = {
	"hpvc-checkpoint", "SECONDS",
	"Checkpoint the job's hpvc cluster every SECONDS; requeued (--requeue), the job goes on from its last checkpoint (docs/checkpoint.md)",
	1, 0, checkpoint_option
};

static struct spank_option spec_opt = {
	"hpvc", "SPEC",
	"Run the job's steps inside the virtual nodes of the hpvc cluster described by SPEC (a TOML file; see docs/slurm.md)",
	1, 0, spec_option
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	/* Every context parses plugstack.conf: an unknown key fails everywhere,
	 * so srun/sbatch refuse before a job is queued. */
	if (configure(ac, av) < 0)
		return -1;
	/* Registered here rather than in a spank_options table: sbatch and
	 * salloc (allocator context) only see options registered at init. */
	spank_context_t ctx = spank_context();
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) {
		if (spank_option_register(sp, &spec_opt) != ESPANK_SUCCESS ||
		    spank_option_register(sp, &checkpoint_opt) != ESPANK_SUCCESS) {
			slurm_error("hpvc: cannot register --hpvc");
			return -1;
		}
	}
	uint32_t step = 0;
	if (ctx == S_CTX_REMOTE && spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS &&
	    step == SLURM_BATCH_SCRIPT)
		return hpvc_batch_restored(sp, &config); /* as root: later hooks run as the user */
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return hpvc_local_post_opt(sp, &config);
	default:
		return 0;
	}
}

/* srun only, after the allocation and the step exist, before any task starts. */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() != S_CTX_LOCAL)
		return 0;
	return hpvc_local_user_init(sp, &config);
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	return hpvc_remote_user_init(sp, &config);
}

/* In slurmstepd, for an --hpvc step of a job (not the batch script, the
 * extern step or an interactive allocation's shell step). */
static int job_step_with_spec(spank_t sp)
{
	uint32_t step = 0;
	if (hpvc_spec_arg == NULL || spank_context() != S_CTX_REMOTE)
		return 0;
	return spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS && step < SLURM_INTERACTIVE_STEP;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!job_step_with_spec(sp))
		return 0;
	return hpvc_task_join(sp);
}

/* slurmstepd, after forking each task and before letting it run: the first
 * call starts the step's PMIx forwarder into the nodes (pmixfwd.c); Slurm's
 * PMIx server is up by then (it starts after user_init). */
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!job_step_with_spec(sp))
		return 0;
	return hpvc_pmix_forward(sp);
}

/* Each task, as the user with its stdio in place: a task of a container node
 * whose node lacks the job's directory goes to the image's WorkingDir; a task
 * of a VM node relays its command to the guest and exits here (vm.c). */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (hpvc_spec_arg == NULL || spank_context() != S_CTX_REMOTE)
		return 0;
	hpvc_task_chdir();
	if (hpvc_task_tty(sp) < 0) /* --pty: the node's own terminal (ptyrelay.c) */
		return -1;
	return hpvc_vm_task(sp);
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	if (configure(ac, av) < 0)
		return -1;
	return hpvc_job_epilog(sp, &config);
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)sp;
	(void)ac;
	(void)av;
	hpvc_free_joins();
	hpvc_config_free(&config);
	configured = 0;
	free(hpvc_spec_arg);
	hpvc_spec_arg = NULL;
	hpvc_checkpoint_every = 0;
	return 0;
}
