/* hpvc-agent frames: 1 byte type, 4 bytes big-endian length, payload (agent.h). */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

int hpvc_write_all(int fd, const void *data, size_t n)
{
	const unsigned char *p = data;
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Exactly n bytes: 1; 0 if the stream ended before the first byte; -1 otherwise. */
static int read_all(int fd, unsigned char *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = read(fd, p + got, n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		if (k == 0)
			return got == 0 ? 0 : -1;
		got += (size_t)k;
	}
	return 1;
}

int hpvc_frame_send(int fd, char type, const void *data, uint32_t len)
{
	unsigned char frame[5 + 1024];
	if (len > HPVC_AGENT_MAX)
		return -1;
	frame[0] = (unsigned char)type;
	frame[1] = (unsigned char)(len >> 24);
	frame[2] = (unsigned char)(len >> 16);
	frame[3] = (unsigned char)(len >> 8);
	frame[4] = (unsigned char)len;
	/* Small frames (words, signals, most output) in one write: one segment. */
	if (len <= sizeof(frame) - 5) {
		if (len)
			memcpy(frame + 5, data, len);
		return hpvc_write_all(fd, frame, 5 + len);
	}
	if (hpvc_write_all(fd, frame, 5) < 0)
		return -1;
	return hpvc_write_all(fd, data, len);
}

int hpvc_frame_recv(int fd, char *type, unsigned char *buf, uint32_t cap, uint32_t *len)
{
	unsigned char head[5];
	int rc = read_all(fd, head, sizeof(head));
	if (rc <= 0)
		return rc;
	uint32_t n = ((uint32_t)head[1] << 24) | ((uint32_t)head[2] << 16) |
		     ((uint32_t)head[3] << 8) | head[4];
	if (n > cap || n > HPVC_AGENT_MAX)
		return -1;
	if (n > 0 && read_all(fd, buf, n) != 1)
		return -1;
	*type = (char)head[0];
	*len = n;
	return 1;
}
