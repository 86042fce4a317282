/* plugstack.conf arguments: strict key=value parsing, unknown keys refused. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hpvc_spank.h"

static int copy_value(char *dst, size_t size, const char *key, const char *value)
{
	if (value[0] != '/') {
		slurm_error("hpvc: plugstack.conf: %s=%s: must be an absolute path", key, value);
		return -1;
	}
	if (strlen(value) >= size) {
		slurm_error("hpvc: plugstack.conf: %s: path too long", key);
		return -1;
	}
	strcpy(dst, value);
	return 0;
}

int hpvc_config_parse(struct hpvc_config *cfg, int ac, char **av)
{
	memset(cfg, 0, sizeof(*cfg));
	strcpy(cfg->hpvc, "/usr/local/bin/hpvc");
	strcpy(cfg->state_dir, "/var/lib/hpvc");
	cfg->timeout = 300;
	for (int i = 0; i < ac; i++) {
		const char *eq = strchr(av[i], '=');
		if (eq == NULL || eq == av[i] || eq[1] == '\0') {
			slurm_error("hpvc: plugstack.conf: argument '%s' is not key=value", av[i]);
			return -1;
		}
		size_t klen = (size_t)(eq - av[i]);
		const char *value = eq + 1;
		if (klen == 4 && strncmp(av[i], "hpvc", klen) == 0) {
			if (copy_value(cfg->hpvc, sizeof(cfg->hpvc), "hpvc", value) < 0)
				return -1;
		} else if (klen == 9 && strncmp(av[i], "state_dir", klen) == 0) {
			if (copy_value(cfg->state_dir, sizeof(cfg->state_dir), "state_dir", value) < 0)
				return -1;
		} else if (klen == 9 && strncmp(av[i], "image_dir", klen) == 0) {
			if (copy_value(cfg->image_dir, sizeof(cfg->image_dir), "image_dir", value) < 0)
				return -1;
		} else if (klen == 7 && strncmp(av[i], "timeout", klen) == 0) {
			char *end = NULL;
			errno = 0;
			long t = strtol(value, &end, 10);
			if (errno != 0 || end == value || *end != '\0' || t < 1 || t > 3600) {
				slurm_error("hpvc: plugstack.conf: timeout=%s: give seconds from 1 to 3600", value);
				return -1;
			}
			cfg->timeout = (int)t;
		} else if ((klen == 6 && strncmp(av[i], "images", klen) == 0) ||
			   (klen == 5 && strncmp(av[i], "kinds", klen) == 0) ||
			   (klen == 7 && strncmp(av[i], "subnets", klen) == 0) ||
			   (klen == 5 && strncmp(av[i], "binds", klen) == 0)) {
			/* Policy: checked by `hpvc node` (Python), passed on verbatim. */
			if (cfg->nsite >= HPVC_MAX_SITE) {
				slurm_error("hpvc: plugstack.conf: too many policy arguments");
				return -1;
			}
			cfg->site[cfg->nsite] = strdup(av[i]);
			if (cfg->site[cfg->nsite] == NULL)
				return -1;
			cfg->nsite++;
		} else {
			slurm_error("hpvc: plugstack.conf: unknown argument '%.*s' (known: hpvc, state_dir, image_dir, timeout, images, kinds, subnets, binds)",
				    (int)klen, av[i]);
			return -1;
		}
	}
	return 0;
}

void hpvc_config_free(struct hpvc_config *cfg)
{
	for (int i = 0; i < cfg->nsite; i++) {
		free(cfg->site[i]);
		cfg->site[i] = NULL;
	}
	cfg->nsite = 0;
}

void hpvc_root_env(const struct hpvc_config *cfg, char *state, size_t ssize, char *images,
		   size_t isize, char *extra, char *env[HPVC_ROOT_ENV])
{
	int k = 0;
	snprintf(state, ssize, "HPVC_STATE_DIR=%s", cfg->state_dir);
	env[k++] = state;
	if (cfg->image_dir[0]) {
		snprintf(images, isize, "HPVC_IMAGE_DIR=%s", cfg->image_dir);
		env[k++] = images;
	}
	env[k++] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	env[k++] = "LC_ALL=C.UTF-8";
	if (extra != NULL)
		env[k++] = extra;
	env[k] = NULL;
}
