/* hpvc-agent server, in the guest: a command with a terminal (frame 't',
 * agent.h). The agent opens a pty pair (posix_openpt/grantpt/unlockpt: the
 * guest's devpts, mounted by hpvc-init); the command becomes a session
 * leader with the slave as its controlling terminal and as stdin, stdout and
 * stderr (one stream: what it writes to either comes back as 'o'), and the
 * agent relays through the master. Job control is the guest kernel's: the
 * line discipline turns the client's Ctrl-C and Ctrl-Z bytes into SIGINT
 * and SIGTSTP for the foreground job, and a shell's jobs live in process
 * groups of their own, so ending the command ends its whole session. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "agent.h"

void hpvc_pty_resize(int master, const unsigned char *size, uint32_t len)
{
	if (len < 4)
		return;
	struct winsize ws = { 0 };
	ws.ws_row = (unsigned short)((size[0] << 8) | size[1]);
	ws.ws_col = (unsigned short)((size[2] << 8) | size[3]);
	if (ws.ws_row && ws.ws_col)
		ioctl(master, TIOCSWINSZ, &ws); /* the kernel tells the foreground job (SIGWINCH) */
}

int hpvc_pty_open(int *slave, const unsigned char *size, uint32_t len)
{
	int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (master < 0)
		return -1;
	char name[64];
	if (grantpt(master) < 0 || unlockpt(master) < 0 ||
	    ptsname_r(master, name, sizeof(name)) != 0 ||
	    (*slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) {
		close(master);
		return -1;
	}
	hpvc_pty_resize(master, size, len);
	return master;
}

void hpvc_pty_signal(int master, int leader, int sig)
{
	pid_t fg = tcgetpgrp(master);
	if (fg > 0)
		kill(-fg, sig);
	/* The shell itself, for what should end it (an interactive shell
	 * ignores SIGTERM: the relay's SIGKILL, or the closed connection, ends it). */
	if (fg != leader && (sig == SIGHUP || sig == SIGTERM || sig == SIGKILL))
		kill(-leader, sig);
}

void hpvc_pty_kill_session(int sid)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	while (d && (e = readdir(d)) != NULL) {
		char *end = NULL;
		long pid = strtol(e->d_name, &end, 10);
		if (end == e->d_name || *end != '\0' || pid <= 1)
			continue;
		char path[64], stat[512];
		snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, stat, sizeof(stat) - 1);
		close(fd);
		if (n <= 0)
			continue;
		stat[n] = '\0';
		/* "pid (comm) state ppid pgrp session ...": comm may hold spaces. */
		char *after = strrchr(stat, ')');
		int ppid, pgrp, session;
		char state;
		if (after && sscanf(after + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) == 4 &&
		    session == sid)
			kill((pid_t)pid, SIGKILL);
	}
	if (d)
		closedir(d);
}
