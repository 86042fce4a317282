/* slurmd's job epilog (root, once per job on every host, also after scancel
 * or a failed task): `hpvc node down` removes every share of the job here. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "hpvc_spank.h"

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
	char *argv[] = { (char *)cfg->hpvc, "node", "down", "--job", sjob, NULL };
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
