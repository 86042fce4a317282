/* slurmd's job epilog (root, once per job on every host, also after scancel
 * or a failed task): `hpvc node down` removes every share of the job here;
 * with --ended (the job is not being requeued) also its checkpoints. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <slurm/slurm.h>

#include "hpvc_spank.h"

/* Has the job ended for good? Not when Slurm requeues it (its state pending,
 * or flagged REQUEUE while it completes), nor when slurmctld cannot say:
 * checkpoints are removed only when it surely ended. */
static int ended_for_good(uint32_t job)
{
	job_info_msg_t *msg = NULL;
	if (slurm_load_job(&msg, job, SHOW_ALL) != SLURM_SUCCESS || msg == NULL ||
	    msg->record_count < 1) {
		if (msg != NULL)
			slurm_free_job_info_msg(msg);
		return 0;
	}
	uint32_t state = msg->job_array[0].job_state;
	slurm_free_job_info_msg(msg);
	if (state & (JOB_REQUEUE | JOB_REQUEUE_HOLD | JOB_REQUEUE_FED))
		return 0;
	return (state & JOB_STATE_BASE) != JOB_PENDING;
}

int hpvc_job_epilog(spank_t sp, const struct hpvc_config *cfg)
{
	uint32_t job = 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
		return 0;
	/* Only jobs that brought shares up here hold a lock file: the rest cost
	 * nothing (no Python started for every job of the cluster). */
	char lock[4200];
	snprintf(lock, sizeof(lock), "%s/jobs/%u.lock", cfg->state_dir, job);
	if (access(lock, F_OK) != 0)
		return 0;
	char sjob[16], state[4200], images[4200];
	snprintf(sjob, sizeof(sjob), "%u", job);
	char *argv[8 + 2 * HPVC_MAX_SITE];
	int k = 0;
	argv[k++] = (char *)cfg->hpvc;
	argv[k++] = "node";
	argv[k++] = "down";
	argv[k++] = "--job";
	argv[k++] = sjob;
	if (hpvc_keeps_checkpoints(cfg) && ended_for_good(job))
		argv[k++] = "--ended";
	k = hpvc_site_argv(cfg, argv, k);
	argv[k] = NULL;
	char *env[HPVC_ROOT_ENV];
	hpvc_root_env(cfg, state, sizeof(state), images, sizeof(images), NULL, env);
	char *out = NULL;
	int rc = hpvc_run(argv, env, cfg->timeout, 1, &out);
	free(out);
	if (rc != 0) {
		slurm_error("hpvc: job %u: taking its virtual nodes down failed; run `hpvc node down --job %u`",
			    job, job);
		return -1;
	}
	return 0;
}
