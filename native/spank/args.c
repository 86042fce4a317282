/* plugstack.conf arguments: strict key=value parsing, unknown keys refused;
 * %h in state_dir and image_dir is this host's short name. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* This host's short name (gethostname() up to the first dot), for %h. */
static int short_hostname(char *name, size_t size)
{
	if (gethostname(name, size) < 0) {
		slurm_error("hpvc: plugstack.conf: cannot read this host's name for %%h: %s",
			    strerror(errno));
		return -1;
	}
	name[size - 1] = '\0';
	name[strcspn(name, ".")] = '\0';
	if (name[0] == '\0' || strchr(name, '/') != NULL) {
		slurm_error("hpvc: plugstack.conf: this host's name '%s' cannot name a directory (%%h)",
			    name);
		return -1;
	}
	return 0;
}

/* A directory argument: an absolute path in which %h stands for this host's
 * short name (one state directory per host where several share a file
 * system, or several slurmd share a machine) and %% for %. Any other %
 * sequence is refused, so a typo cannot become a literal directory name. */
static int copy_dir(char *dst, size_t size, const char *key, const char *value)
{
	char host[256] = "";
	size_t k = 0;
	if (value[0] != '/')
		return copy_value(dst, size, key, value);
	for (const char *p = value; *p; p++) {
		const char *add = p;
		size_t n = 1;
		if (*p == '%') {
			if (p[1] == 'h') {
				if (host[0] == '\0' && short_hostname(host, sizeof(host)) < 0)
					return -1;
				add = host;
				n = strlen(host);
			} else if (p[1] != '%') {
				slurm_error("hpvc: plugstack.conf: %s=%s: unknown sequence '%%%.1s' (known: %%h, this host's short name; %%%%, a %%)",
					    key, value, p + 1);
				return -1;
			}
			p++;
		}
		if (k + n >= size) {
			slurm_error("hpvc: plugstack.conf: %s: path too long", key);
			return -1;
		}
		memcpy(dst + k, add, n);
		k += n;
	}
	dst[k] = '\0';
	return 0;
}

/* Site policy keys: checked by `hpvc node` (Python, hpvc.slurm.policy.Site). */
static const char *const POLICY_KEYS[] = {
	"images", "kinds", "subnets", "binds", "user_subnets", "io_weight",
	"threads_as_cores", "max_nodes", "max_groups", "max_disk", "max_console",
	"checkpoints", "checkpoint_min", "checkpoint_via",
};

static int is_policy_key(const char *arg, size_t klen)
{
	for (size_t k = 0; k < sizeof(POLICY_KEYS) / sizeof(POLICY_KEYS[0]); k++) {
		if (strlen(POLICY_KEYS[k]) == klen && strncmp(arg, POLICY_KEYS[k], klen) == 0)
			return 1;
	}
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
			if (copy_dir(cfg->state_dir, sizeof(cfg->state_dir), "state_dir", value) < 0)
				return -1;
		} else if (klen == 9 && strncmp(av[i], "image_dir", klen) == 0) {
			if (copy_dir(cfg->image_dir, sizeof(cfg->image_dir), "image_dir", value) < 0)
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
		} else if (is_policy_key(av[i], klen)) {
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
			slurm_error("hpvc: plugstack.conf: unknown argument '%.*s' (known: hpvc, state_dir, image_dir, timeout, images, kinds, subnets, binds, user_subnets, io_weight, threads_as_cores, max_nodes, max_groups, max_disk, max_console, checkpoints, checkpoint_min, checkpoint_via)",
				    (int)klen, av[i]);
			return -1;
		}
	}
	return 0;
}

const char *hpvc_checkpoints_dir(const struct hpvc_config *cfg)
{
	for (int i = 0; i < cfg->nsite; i++) {
		if (strncmp(cfg->site[i], "checkpoints=", 12) == 0)
			return cfg->site[i] + 12;
	}
	return NULL;
}

int hpvc_keeps_checkpoints(const struct hpvc_config *cfg)
{
	return hpvc_checkpoints_dir(cfg) != NULL;
}

int hpvc_site_argv(const struct hpvc_config *cfg, char **argv, int k)
{
	for (int i = 0; i < cfg->nsite; i++) {
		argv[k++] = "--site";
		argv[k++] = cfg->site[i];
	}
	return k;
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
