/*
 * hpvc-nfsfuse's parts: the FUSE operations (hpvc-nfsfuse.c) and the
 * write-behind and event loop (writebehind.c) share the one libnfs context.
 */
#ifndef HPVC_NFSFUSE_H
#define HPVC_NFSFUSE_H

#include <fuse.h>
#include <nfsc/libnfs.h>
#include <stddef.h>
#include <sys/types.h>

#define PROG "hpvc-nfsfuse"

extern struct nfs_context *nfs; /* the one context (replaced on reconnect) */
extern int broken;              /* the connection died: reconnect before the next call */

/* An open file: fuse_file_info.fh points to one. */
struct nf_file {
	struct nfsfh *fh;
	int error;        /* the first failed write-behind not yet reported (-errno) */
	int through;      /* opened O_SYNC, O_DSYNC or O_DIRECT: a write waits for the server */
};

/* Send a write and answer at once: size, or an earlier write's error. */
int wb_write(struct nf_file *f, const char *path, const char *buf, size_t size, off_t off);
/* Wait for every write sent (before any other operation, and a reconnect). */
void wb_drain(void);
/* What close() reports: the file's writes answered, and an error of theirs. */
int wb_flush(struct nf_file *f);
/* Serve FUSE and the NFS connection until unmounted; fuse_session_loop's rc. */
int wb_loop(struct fuse_session *se);

#endif
