/* srun, sbatch, salloc (local and allocator contexts), as the submitting user:
 * `hpvc node check SPEC` reads and checks the spec now, so a bad spec stops
 * the job before it is queued; the spec then travels in the job's
 * environment (HPVC_SPEC_B64), so the hosts never read a user's file as root. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "hpvc_spank.h"

int hpvc_local_post_opt(spank_t sp, const struct hpvc_config *cfg)
{
	char real[PATH_MAX];
	if (hpvc_spec_arg == NULL)
		return 0;
	if (realpath(hpvc_spec_arg, real) == NULL) {
		slurm_error("hpvc: --hpvc=%s: no such file (give the path of a cluster spec)", hpvc_spec_arg);
		return -1;
	}
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
	int rc = hpvc_run(argv, NULL, cfg->timeout, 0, &out);
	if (rc != 0) {
		free(out);
		if (rc > 0)
			slurm_error("hpvc: the spec %s was refused; no job was started", real);
		return -1;
	}
	out[strcspn(out, "\r\n")] = '\0';
	if (out[0] == '\0') {
		free(out);
		slurm_error("hpvc: %s node check printed nothing", cfg->hpvc);
		return -1;
	}
	/* srun/sbatch/salloc pass their environment on to the job (spank_setenv
	 * works in remote context only). */
	(void)sp;
	int err = setenv(HPVC_SPEC_ENV, out, 1) != 0 || setenv(HPVC_SPEC_PATH_ENV, real, 1) != 0;
	free(out);
	if (err) {
		slurm_error("hpvc: cannot pass the spec on in the job's environment");
		return -1;
	}
	return 0;
}
