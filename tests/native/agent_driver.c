/* Test driver for native/agent (tests/integration/test_agent_key.py): the
 * agent's server and client on the host, no VM.
 *
 *   agent_driver hmac KEYHEX AHEX BHEX     print HMAC-SHA256(key, a || b) in hex
 *   agent_driver serve IP/N KEYFILE        the agent (KEYFILE "-": none); prints "ready PID"
 *   agent_driver run IP KEYFILE CMD...     connect from a reserved port, prove the key, run
 *                                          (in $AGENT_CWD, else $AGENT_FALLBACK, where set)
 *   agent_driver nologin IP CMD...         connect from a reserved port, send the command at once
 *   agent_driver high IP KEYFILE CMD...    connect from an unprivileged port, prove the key, run
 *   agent_driver chan IP KEYFILE UID CMD...  as run, then as UID (a task relay after Slurm's
 *                                          change of ids) with this environment's PMIx
 *                                          server and PMI_FD carried (chan.c)
 *   agent_driver pmixhs NSPACE RANK UID GID HEX  hpvc_pmix_request_check: "RC WHY HEX" */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"

static size_t unhex(const char *s, unsigned char *out)
{
	size_t n = 0;
	for (; s[0] && s[1]; s += 2)
		sscanf(s, "%2hhx", &out[n++]);
	return n;
}

static int hmac(char **argv)
{
	static unsigned char k[4096], a[4096], b[4096], mac[32];
	size_t kl = unhex(argv[2], k), al = unhex(argv[3], a), bl = unhex(argv[4], b);
	hpvc_hmac_sha256(k, kl, a, al, b, bl, mac);
	for (int i = 0; i < 32; i++)
		printf("%02x", mac[i]);
	printf("\n");
	return 0;
}

static int high_port(const char *ip)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(HPVC_AGENT_PORT) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	inet_pton(AF_INET, ip, &to.sin_addr);
	return connect(fd, (struct sockaddr *)&to, sizeof(to)) == 0 ? fd : -1;
}

extern char **environ;
static int channels; /* chan: the command gets this environment, channels carried */
static long as_uid = -1; /* chan: the ids after login */

static int run(int sock, const char *keyfile, char **cmd)
{
	const char *why = "";
	unsigned char key[HPVC_AGENT_KEY_MAX];
	if (sock < 0) {
		perror("connect");
		return 254;
	}
	if (keyfile) {
		int klen = hpvc_agent_read_key(keyfile, key);
		if (klen < 0 || hpvc_agent_login(sock, key, (size_t)klen, &why) < 0) {
			fprintf(stderr, "driver: login: %s\n", klen < 0 ? strerror(errno) : why);
			return 255;
		}
	}
	uid_t u = (uid_t)as_uid;
	if (as_uid >= 0 && (setresgid(u, u, u) < 0 || setresuid(u, u, u) < 0))
		return 251;
	if (channels && hpvc_chan_host_setup(environ, &why) < 0) {
		fprintf(stderr, "driver: %s\n", why);
		return 252;
	}
	int rc = hpvc_agent_run(sock, cmd, channels ? environ : NULL, getenv("AGENT_CWD"),
				getenv("AGENT_FALLBACK"), -1, &why);
	if (rc == -256)
		fprintf(stderr, "driver: %s\n", why);
	return rc == -256 ? 253 : rc;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && strcmp(argv[1], "hmac") == 0)
		return hmac(argv);
	if (argc == 4 && strcmp(argv[1], "serve") == 0) {
		unsigned char key[HPVC_AGENT_KEY_MAX];
		int klen = strcmp(argv[3], "-") ? hpvc_agent_read_key(argv[3], key) : 0;
		char *slash = strchr(argv[2], '/');
		if (klen < 0 || slash == NULL)
			return 2;
		*slash = '\0';
		pid_t pid = hpvc_agent_start(argv[2], atoi(slash + 1), key, (size_t)klen);
		printf("ready %d\n", (int)pid); /* the listener: the test ends it by its PID */
		fflush(stdout);
		return pid < 0 ? 1 : waitpid(pid, NULL, 0) < 0;
	}
	if (argc >= 5 && strcmp(argv[1], "run") == 0)
		return run(hpvc_agent_connect(argv[2], HPVC_AGENT_PORT), argv[3], argv + 4);
	if (argc >= 4 && strcmp(argv[1], "nologin") == 0)
		return run(hpvc_agent_connect(argv[2], HPVC_AGENT_PORT), NULL, argv + 3);
	if (argc >= 6 && strcmp(argv[1], "chan") == 0) {
		int sock = hpvc_agent_connect(argv[2], HPVC_AGENT_PORT);
		as_uid = atol(argv[4]);
		channels = 1;
		return run(sock, argv[3], argv + 5);
	}
	if (argc == 7 && strcmp(argv[1], "pmixhs") == 0) {
		static unsigned char msg[HPVC_PMIX_HEAD_MAX];
		const char *why = "-";
		uint32_t n = (uint32_t)unhex(argv[6], msg);
		int rc = hpvc_pmix_request_check(msg, n, argv[2], (uint32_t)atoi(argv[3]),
						 (unsigned)atoi(argv[4]), (unsigned)atoi(argv[5]), &why);
		printf("%d %s\n", rc, why);
		for (uint32_t i = 0; i < n; i++)
			printf("%02x", msg[i]);
		printf("\n");
		return 0;
	}
	if (argc >= 5 && strcmp(argv[1], "high") == 0)
		return run(high_port(argv[2]), argv[3], argv + 4);
	fprintf(stderr, "usage: see agent_driver.c\n");
	return 2;
}
