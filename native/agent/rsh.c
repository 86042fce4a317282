/* hpvc-rsh: run a command on another node of the job, through its hpvc-agent.
 *
 *   hpvc-rsh [-x] [-n] [-l root] NODE COMMAND [WORDS...]
 *
 * The words after NODE are joined with spaces and run by /bin/sh -c on NODE,
 * as ssh does; stdin, stdout, stderr, the exit status and signals are carried
 * through. Open MPI's mpirun uses it as its launch agent inside the guests
 * (OMPI_MCA_plm_rsh_agent), so MPI needs no ssh keys between the nodes. Root
 * only: the agent trusts reserved ports, and the job's secret it reads from
 * /run/hpvc/agent-key (agent.h).
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

int main(int argc, char **argv)
{
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-l") == 0 && i + 1 < argc)
			i++; /* the remote user: commands run as root in the guests */
		else if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
	}
	if (argc - i < 2) {
		fprintf(stderr, "usage: hpvc-rsh [-x] [-n] NODE COMMAND [WORDS...]\n");
		return 2;
	}
	char ip[64];
	if (lookup(argv[i], ip, sizeof(ip)) < 0) {
		fprintf(stderr, "hpvc-rsh: %s: not in /etc/hosts\n", argv[i]);
		return 255;
	}
	size_t len = 0;
	for (int k = i + 1; k < argc; k++)
		len += strlen(argv[k]) + 1;
	char *line = malloc(len + 1);
	if (line == NULL)
		return 255;
	line[0] = '\0';
	for (int k = i + 1; k < argc; k++) {
		strcat(line, argv[k]);
		if (k + 1 < argc)
			strcat(line, " ");
	}
	int sock = hpvc_agent_connect(ip, HPVC_AGENT_PORT);
	if (sock < 0) {
		fprintf(stderr, "hpvc-rsh: %s (%s): %s\n", argv[i], ip, strerror(errno));
		return 255;
	}
	char *cmd[] = { "/bin/sh", "-c", line, NULL };
	const char *why = "";
	unsigned char key[HPVC_AGENT_KEY_MAX];
	int klen = hpvc_agent_read_key(HPVC_AGENT_KEY_FILE, key);
	if (klen < 0) {
		fprintf(stderr, "hpvc-rsh: %s: %s\n", HPVC_AGENT_KEY_FILE, strerror(errno));
		return 255;
	}
	if (hpvc_agent_login(sock, key, (size_t)klen, &why) < 0) {
		fprintf(stderr, "hpvc-rsh: %s: %s\n", argv[i], why);
		return 255;
	}
	int rc = hpvc_agent_run(sock, cmd, NULL, NULL, STDIN_FILENO, &why);
	if (rc == -256) {
		fprintf(stderr, "hpvc-rsh: %s: %s\n", argv[i], why);
		return 255;
	}
	return rc >= 0 ? rc : 128 - rc;
}
