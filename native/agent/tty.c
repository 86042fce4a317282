/* hpvc-agent client with a terminal (frames 't' and 'w', agent.h): what the
 * SPANK relay does under `srun --pty` and hpvc-rsh does with -t.
 *
 * The client's own terminal goes raw for the run (cfmakeraw: no echo, no
 * line editing, no signal keys, no output processing), so every key, Ctrl-C
 * and Ctrl-Z included, travels as a byte to the guest's pty, whose line
 * discipline turns it into SIGINT or SIGTSTP for the guest's foreground job,
 * as ssh -t does. The terminal's settings are restored before returning. The
 * window size goes with 't' and again as 'w' whenever it changes: on SIGWINCH
 * (client.c), and by looking again every half second, for a terminal whose
 * size changes reach no process of ours as a signal (the pty slurmstepd made
 * for `srun --pty` need not have the relay as its foreground group). */
#define _GNU_SOURCE
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "agent.h"

static unsigned char last_size[4];

static int size_of(int fd, unsigned char out[4])
{
	struct winsize ws;
	if (ioctl(fd, TIOCGWINSZ, &ws) < 0)
		return -1;
	out[0] = (unsigned char)(ws.ws_row >> 8);
	out[1] = (unsigned char)ws.ws_row;
	out[2] = (unsigned char)(ws.ws_col >> 8);
	out[3] = (unsigned char)ws.ws_col;
	return 0;
}

int hpvc_tty_send_start(int sock, int tty, const char *term)
{
	unsigned char frame[4 + 256];
	size_t n = term ? strnlen(term, sizeof(frame) - 4) : 0;
	if (size_of(tty, frame) < 0)
		memset(frame, 0, 4); /* no size known: the guest keeps its default */
	memcpy(last_size, frame, 4);
	if (n)
		memcpy(frame + 4, term, n);
	return hpvc_frame_send(sock, 't', frame, (uint32_t)(4 + n));
}

int hpvc_tty_send_size(int sock, int tty)
{
	unsigned char now[4];
	if (size_of(tty, now) < 0 || memcmp(now, last_size, 4) == 0)
		return 0;
	memcpy(last_size, now, 4);
	return hpvc_frame_send(sock, 'w', now, 4);
}

int hpvc_agent_run_tty(int sock, char *const argv[], char *const env[], const char *cwd,
		       const char *fallback, int tty, const char *term, const char **why)
{
	struct termios saved, raw;
	if (tcgetattr(tty, &saved) < 0) {
		*why = "cannot read the terminal's settings";
		return -256;
	}
	raw = saved;
	cfmakeraw(&raw);
	if (tcsetattr(tty, TCSANOW, &raw) < 0) {
		*why = "cannot put the terminal in raw mode";
		return -256;
	}
	hpvc_agent_use_tty(tty, term);
	int rc = hpvc_agent_run(sock, argv, env, cwd, fallback, tty, why);
	tcsetattr(tty, TCSADRAIN, &saved);
	return rc;
}
