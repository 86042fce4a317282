/* hpvc-nodeinit serve --agent: the node's hpvc-agent beside its init, and
 * hpvc-rsh in the same binary (what /dev/hpvc-rsh is bound from).
 *
 * Why: mpirun (or MPICH's mpiexec) started inside one container node must
 * start its daemons in the others, and images have no sshd. VM guests run
 * native/agent's server for that, reached with hpvc-rsh; a container node
 * gets the very same server, forked by its init before anything else, so
 * the agent and the commands it starts stay in the node's own process tree
 * (a checkpoint takes them with the node, their TCP connections included).
 * It listens on eth0's address with the trust rules of agent.h (a reserved
 * port of the cluster's subnet, and the cluster's key, bound read-only at
 * HPVC_AGENT_KEY_NODE for root alone). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "agent.h"
#include "nodeinit.h"

#define AGENT_IF "eth0" /* the node's link on the cluster network (hpvc.host.net) */

/* eth0's IPv4 address into ip and its prefix length: 0, or -1. */
static int cluster_address(char *ip, size_t len, int *prefix) {
  struct ifaddrs *all;
  if (getifaddrs(&all) != 0) return -1;
  int found = -1;
  for (struct ifaddrs *a = all; a && found != 0; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !a->ifa_netmask) continue;
    if (strcmp(a->ifa_name, AGENT_IF) != 0) continue;
    struct in_addr addr = ((struct sockaddr_in *)a->ifa_addr)->sin_addr;
    uint32_t mask = ntohl(((struct sockaddr_in *)a->ifa_netmask)->sin_addr.s_addr);
    if (!inet_ntop(AF_INET, &addr, ip, (socklen_t)len)) continue;
    *prefix = __builtin_popcount(mask);
    found = 0;
  }
  freeifaddrs(all);
  if (found != 0) errno = EADDRNOTAVAIL;
  return found;
}

int start_agent(void) {
  char ip[INET_ADDRSTRLEN];
  int prefix = 0;
  unsigned char key[HPVC_AGENT_KEY_MAX];
  if (cluster_address(ip, sizeof ip, &prefix) != 0) {
    say("no agent: no IPv4 address on " AGENT_IF ": %s", strerror(errno));
    return -1;
  }
  int klen = hpvc_agent_read_key(HPVC_AGENT_KEY_NODE, key);
  if (klen < 0) {
    say("no agent: %s: %s", HPVC_AGENT_KEY_NODE, strerror(errno));
    return -1;
  }
  int pid = hpvc_agent_start(ip, prefix, key, (size_t)klen);
  int err = errno;
  memset(key, 0, sizeof key);
  if (pid < 0) {
    say("no agent on %s port %d: %s", ip, HPVC_AGENT_PORT, strerror(err));
    return -1;
  }
  return 0;
}
