/* hpvc-agent's second fence: a secret per job (agent.h says who may connect).
 *
 * The agent sends a nonce of 32 random bytes (frame 'n'); the client answers
 * HMAC-SHA256(key, nonce || "hpvc-agent client") (frame 'h'); the agent
 * compares in constant time and says 'k' (go on) or refuses with an 'r' line
 * and an end frame. The key never crosses the wire, and an answer is good for
 * one nonce only.
 *
 * SHA-256 and HMAC (FIPS 180-4, RFC 2104) are written here rather than taken
 * from libcrypto: the guest binaries are static (gcc -static against the
 * host's glibc, nothing to load in the guest), a static libcrypto drags in
 * OpenSSL 3's provider machinery (megabytes per binary, and dlopen from a
 * static binary), and every host that builds guest artifacts would need
 * libssl-dev. tests/unit/test_agent_auth.py checks this code against
 * Python's hashlib and hmac on the RFC 4231 vectors. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "agent.h"

struct sha256 {
	uint32_t h[8];
	unsigned char block[64];
	size_t fill;
	uint64_t bytes;
};

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	0xc67178f2
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(struct sha256 *s, const unsigned char *p)
{
	uint32_t w[64], v[8];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	memcpy(v, s->h, sizeof(v));
	for (int i = 0; i < 64; i++) {
		uint32_t e = v[4], a = v[0];
		uint32_t t1 = v[7] + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & v[5]) ^ (~e & v[6])) +
			      K[i] + w[i];
		uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) +
			      ((a & v[1]) ^ (a & v[2]) ^ (v[1] & v[2]));
		memmove(v + 1, v, 7 * sizeof(v[0]));
		v[4] += t1;
		v[0] = t1 + t2;
	}
	for (int i = 0; i < 8; i++)
		s->h[i] += v[i];
}

static void sha256_init(struct sha256 *s)
{
	static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	memcpy(s->h, h0, sizeof(h0));
	s->fill = 0;
	s->bytes = 0;
}

static void sha256_add(struct sha256 *s, const void *data, size_t n)
{
	const unsigned char *p = data;
	s->bytes += n;
	while (n > 0) {
		size_t k = 64 - s->fill < n ? 64 - s->fill : n;
		memcpy(s->block + s->fill, p, k);
		s->fill += k;
		p += k;
		n -= k;
		if (s->fill == 64) {
			sha256_block(s, s->block);
			s->fill = 0;
		}
	}
}

static void sha256_end(struct sha256 *s, unsigned char out[32])
{
	uint64_t bits = s->bytes * 8;
	unsigned char pad = 0x80, zero = 0, len[8];
	sha256_add(s, &pad, 1);
	while (s->fill != 56)
		sha256_add(s, &zero, 1);
	for (int i = 0; i < 8; i++)
		len[i] = (unsigned char)(bits >> (56 - 8 * i));
	sha256_add(s, len, 8);
	for (int i = 0; i < 8; i++) {
		out[4 * i] = (unsigned char)(s->h[i] >> 24);
		out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
		out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
		out[4 * i + 3] = (unsigned char)s->h[i];
	}
}

void hpvc_hmac_sha256(const void *key, size_t klen, const void *a, size_t alen, const void *b,
		      size_t blen, unsigned char out[32])
{
	unsigned char k[64] = { 0 }, pad[64], inner[32];
	struct sha256 s;
	if (klen > 64) {
		sha256_init(&s);
		sha256_add(&s, key, klen);
		sha256_end(&s, k);
	} else if (klen > 0) {
		memcpy(k, key, klen);
	}
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x36;
	sha256_init(&s);
	sha256_add(&s, pad, 64);
	sha256_add(&s, a, alen);
	sha256_add(&s, b, blen);
	sha256_end(&s, inner);
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x5c;
	sha256_init(&s);
	sha256_add(&s, pad, 64);
	sha256_add(&s, inner, 32);
	sha256_end(&s, out);
	memset(k, 0, sizeof(k));
	memset(pad, 0, sizeof(pad));
}

int hpvc_agent_read_key(const char *path, unsigned char key[HPVC_AGENT_KEY_MAX])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t n = 0;
	while (n < HPVC_AGENT_KEY_MAX) {
		ssize_t k = read(fd, key + n, HPVC_AGENT_KEY_MAX - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	close(fd);
	if (n < HPVC_AGENT_KEY_MIN) {
		errno = EINVAL;
		return -1;
	}
	return (int)n;
}

static const char LABEL[] = "hpvc-agent client";

static void answer(const unsigned char *key, size_t klen, const unsigned char *nonce,
		   unsigned char out[32])
{
	hpvc_hmac_sha256(key, klen, nonce, HPVC_AGENT_NONCE, LABEL, sizeof(LABEL) - 1, out);
}

/* Reads on sock give up after s seconds (0: never): a client that stalls
 * in the exchange does not hold its handler for ever. */
static void read_timeout(int sock, int s)
{
	struct timeval tv = { .tv_sec = s, .tv_usec = 0 };
	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

int hpvc_agent_challenge(int sock, const unsigned char *key, size_t klen)
{
	unsigned char nonce[HPVC_AGENT_NONCE], want[32], got[64];
	if (getrandom(nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce))
		return -1;
	if (hpvc_frame_send(sock, 'n', nonce, sizeof(nonce)) < 0)
		return -1;
	read_timeout(sock, 30);
	char type;
	uint32_t len = 0;
	int rc = hpvc_frame_recv(sock, &type, got, sizeof(got), &len);
	read_timeout(sock, 0);
	if (rc != 1)
		return -1;
	if (klen < HPVC_AGENT_KEY_MIN || type != 'h' || len != 32)
		return 0;
	answer(key, klen, nonce, want);
	unsigned char diff = 0;
	for (int i = 0; i < 32; i++)
		diff |= (unsigned char)(want[i] ^ got[i]);
	if (diff != 0)
		return 0;
	return hpvc_frame_send(sock, 'k', NULL, 0) < 0 ? -1 : 1;
}

void hpvc_agent_refuse(int sock, const char *why)
{
	char line[256];
	int n = snprintf(line, sizeof(line), "hpvc-agent: refused: %s\n", why);
	if (n > 0 && n < (int)sizeof(line))
		hpvc_frame_send(sock, 'r', line, (uint32_t)n);
	unsigned char end[2] = { 0, 255 };
	hpvc_frame_send(sock, 'x', end, 2);
}

int hpvc_agent_login(int sock, const unsigned char *key, size_t klen, const char **why)
{
	unsigned char buf[512], mac[32];
	for (;;) {
		char type;
		uint32_t len = 0;
		if (hpvc_frame_recv(sock, &type, buf, sizeof(buf), &len) != 1) {
			*why = "the node closed the connection before it let the command in";
			return -1;
		}
		if (type == 'r') /* the agent's reason, when it refuses */
			(void)hpvc_write_all(STDERR_FILENO, buf, len);
		else if (type == 'x') {
			*why = "refused by the node's agent";
			return -1;
		} else if (type == 'k')
			return 0;
		else if (type == 'n' && len == HPVC_AGENT_NONCE) {
			answer(key, klen, buf, mac);
			if (hpvc_frame_send(sock, 'h', mac, sizeof(mac)) < 0) {
				*why = "cannot answer the node's agent";
				return -1;
			}
		} else {
			*why = "the node's agent sent something unexpected";
			return -1;
		}
	}
}
