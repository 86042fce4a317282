/* hpvc-rsh: run a command on another node of the job, through its hpvc-agent.
 *
 *   hpvc-rsh [-x] [-n] [-t] [-l root] NODE COMMAND [WORDS...]
 *   hpvc-rsh -a [-t] [-k KEYFILE] [-e K=V]... [-C DIR] IP COMMAND [WORDS...]
 *
 * The words after NODE are joined with spaces and run by /bin/sh -c on NODE,
 * as ssh does; stdin, stdout, stderr, the exit status and signals are carried
 * through. Open MPI's mpirun uses it as its launch agent inside the guests
 * (OMPI_MCA_plm_rsh_agent), so MPI needs no ssh keys between the nodes. Root
 * only: the agent trusts reserved ports, and the job's secret it reads from
 * /run/hpvc/agent-key (agent.h), or from KEYFILE (-k).
 *
 * With -a the words are the command's argv as they are (no shell: an image
 * may have none), with the environment entries of -e and the working
 * directory of -C: how `hpvc exec` reaches a VM node from the host, with the
 * cluster's agent.key, when the node's image has no sshd (docs/vms.md).
 *
 * In a container node there is no /run/hpvc/agent-key: the cluster's key is
 * bound at HPVC_AGENT_KEY_NODE, read when the first is missing (and no -k).
 * hpvc-nodeinit carries this same program (HPVC_RSH_MAIN names its main).
 *
 * With -t, and stdin a terminal, the command gets a terminal in the guest
 * (a pty; tty.c, pty.c): `hpvc exec -t` and `hpvc console`. As with ssh -t,
 * a stdin that is no terminal gets none.
 *
 * NODE is looked up in /etc/hosts (which hpvc-init writes for the whole
 * cluster) and not with getaddrinfo: a static binary cannot load the guest's
 * NSS modules reliably, and the cluster's names live in that file alone. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

static int lookup(const char *name, char *ip, size_t size)
{
	struct in_addr a;
	if (inet_pton(AF_INET, name, &a) == 1) {
		snprintf(ip, size, "%s", name);
		return 0;
	}
	FILE *f = fopen("/etc/hosts", "re");
	char line[512];
	while (f && fgets(line, sizeof(line), f)) {
		char *save = NULL, *addr = strtok_r(line, " \t\n", &save);
		if (addr == NULL || addr[0] == '#' || inet_pton(AF_INET, addr, &a) != 1)
			continue;
		for (char *w = strtok_r(NULL, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
			if (w[0] == '#')
				break;
			if (strcmp(w, name) == 0) {
				snprintf(ip, size, "%s", addr);
				fclose(f);
				return 0;
			}
		}
	}
	if (f)
		fclose(f);
	return -1;
}

/* The words joined with spaces (what ssh hands the remote shell), or NULL. */
static char *join_words(char *const words[])
{
	size_t len = 0;
	for (int k = 0; words[k]; k++)
		len += strlen(words[k]) + 1;
	char *line = malloc(len + 1);
	if (line == NULL)
		return NULL;
	line[0] = '\0';
	for (int k = 0; words[k]; k++) {
		strcat(line, words[k]);
		if (words[k + 1])
			strcat(line, " ");
	}
	return line;
}

#ifndef HPVC_RSH_MAIN
#define HPVC_RSH_MAIN main
#endif

int HPVC_RSH_MAIN(int argc, char **argv)
{
	int i = 1, as_argv = 0, envc = 0, tty = 0;
	const char *key_file = HPVC_AGENT_KEY_FILE, *cwd = NULL;
	char **env = calloc((size_t)argc + 1, sizeof(char *));
	if (env == NULL)
		return 255;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-l") == 0 && i + 1 < argc)
			i++; /* the remote user: commands run as root in the guests */
		else if (strcmp(argv[i], "-a") == 0)
			as_argv = 1;
		else if (strcmp(argv[i], "-t") == 0)
			tty = isatty(STDIN_FILENO);
		else if (strcmp(argv[i], "-k") == 0 && i + 1 < argc)
			key_file = argv[++i];
		else if (strcmp(argv[i], "-e") == 0 && i + 1 < argc)
			env[envc++] = argv[++i];
		else if (strcmp(argv[i], "-C") == 0 && i + 1 < argc)
			cwd = argv[++i];
		else if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
	}
	if (argc - i < 2) {
		fprintf(stderr, "usage: hpvc-rsh [-x] [-n] [-t] [-a] [-k KEYFILE] [-e K=V] [-C DIR] NODE"
				" COMMAND [WORDS...]\n");
		return 2;
	}
	char ip[64];
	if (lookup(argv[i], ip, sizeof(ip)) < 0) {
		fprintf(stderr, "hpvc-rsh: %s: not in /etc/hosts\n", argv[i]);
		return 255;
	}
	char *line = join_words(argv + i + 1);
	if (line == NULL)
		return 255;
	int sock = hpvc_agent_connect(ip, HPVC_AGENT_PORT);
	if (sock < 0) {
		fprintf(stderr, "hpvc-rsh: %s (%s): %s\n", argv[i], ip, strerror(errno));
		return 255;
	}
	char *shell[] = { "/bin/sh", "-c", line, NULL };
	char **cmd = as_argv ? argv + i + 1 : shell;
	const char *why = "";
	unsigned char key[HPVC_AGENT_KEY_MAX];
	int klen = hpvc_agent_read_key(key_file, key);
	if (klen < 0 && errno == ENOENT && strcmp(key_file, HPVC_AGENT_KEY_FILE) == 0) {
		key_file = HPVC_AGENT_KEY_NODE; /* a container node's */
		klen = hpvc_agent_read_key(key_file, key);
	}
	if (klen < 0) {
		fprintf(stderr, "hpvc-rsh: %s: %s\n", key_file, strerror(errno));
		return 255;
	}
	if (hpvc_agent_login(sock, key, (size_t)klen, &why) < 0) {
		fprintf(stderr, "hpvc-rsh: %s: %s\n", argv[i], why);
		return 255;
	}
	int rc = tty ? hpvc_agent_run_tty(sock, cmd, envc ? env : NULL, cwd, NULL, STDIN_FILENO,
					  getenv("TERM"), &why)
		     : hpvc_agent_run(sock, cmd, envc ? env : NULL, cwd, NULL, STDIN_FILENO, &why);
	if (rc == -256) {
		fprintf(stderr, "hpvc-rsh: %s: %s\n", argv[i], why);
		return 255;
	}
	return rc >= 0 ? rc : 128 - rc;
}
