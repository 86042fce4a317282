/* The first message a PMIx 4 client sends its server over TCP (the
 * connection request), as the task relay checks it before a guest's client
 * reaches the step's PMIx server (chan.c).
 *
 * Layout, from PMIx 4.2's ptl base (the client builds it, the server's
 * connection handler parses it; both on this host's byte order where noted):
 *   header: int32 index, uint32 tag, size_t nbytes (host order; 16 bytes on
 *           64-bit Linux), then nbytes of:
 *   the security module's name, NUL-ended ("native");
 *   uint32 (network order) the credential's length, then the credential:
 *           for "native" over TCP the client's effective uid and gid (uid_t,
 *           gid_t, host order), which the server takes as they come and
 *           compares with the uid and gid the task was registered with;
 *   uint8 the kind of process (0: a simple client, an MPI rank);
 *   for a simple client its namespace (NUL-ended) and rank (uint32, network
 *   order); then its version, buffer types and gds module (not looked at).
 * Hand-written: no library parses it outside PMIx itself, whose internals are
 * not installed; the layout is small and fixed for a simple client. */
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "agent.h"

#define HEADER 16

int hpvc_pmix_request_check(unsigned char *msg, uint32_t len, const char *nspace, uint32_t rank,
			    unsigned uid, unsigned gid, const char **why)
{
	if (len < HEADER)
		return 0;
	uint64_t nbytes;
	memcpy(&nbytes, msg + 8, sizeof(nbytes));
	if (nbytes > HPVC_PMIX_HEAD_MAX - HEADER) {
		*why = "not a PMIx connection request";
		return -1;
	}
	if (len < HEADER + nbytes)
		return 0;
	if (len > HEADER + nbytes) {
		*why = "the client sent more than its connection request before the server's answer";
		return -1;
	}
	unsigned char *p = msg + HEADER, *end = p + nbytes;
	unsigned char *nul = memchr(p, '\0', (size_t)(end - p));
	if (nul == NULL || strcmp((const char *)p, "native") != 0) {
		*why = "only PMIx's native security is carried (PMIX_MCA_psec=native)";
		return -1;
	}
	p = nul + 1;
	uint32_t clen;
	if (end - p < 4)
		goto bad;
	memcpy(&clen, p, 4);
	clen = ntohl(clen);
	p += 4;
	if (clen != sizeof(uid_t) + sizeof(gid_t) || end - p < (long)clen + 1)
		goto bad;
	/* The claim becomes the relay's own ids: the job's user, on this host. */
	memcpy(p, &uid, sizeof(uid));
	memcpy(p + sizeof(uid), &gid, sizeof(gid));
	p += clen;
	if (*p++ != 0) {
		*why = "only an MPI rank (a simple PMIx client) is carried, not a tool or launcher";
		return -1;
	}
	nul = memchr(p, '\0', (size_t)(end - p));
	if (nul == NULL || end - (nul + 1) < 4)
		goto bad;
	uint32_t r;
	memcpy(&r, nul + 1, 4);
	if (strcmp((const char *)p, nspace) != 0 || ntohl(r) != rank) {
		*why = "the request names another namespace or rank than this task's";
		return -1;
	}
	return 1;
bad:
	*why = "a malformed PMIx connection request";
	return -1;
}
