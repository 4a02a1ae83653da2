/*
 * smtp_client -- a small blocking SMTP client for the injectors (RFC 5321), to talk to
 * sluiced's intake on a unix socket or loopback.
 *
 * A command may block (it runs in the `sluice` command, never in the daemon), but never
 * forever: connecting, each reply and each write have a deadline.  One command at a
 * time, no PIPELINING: each reply is read before the next command, so every reply can be
 * told apart and reported.  Replies are read by proto/smtp_reply.h's reader, the relay's,
 * with its limits; the lines kept for reports are bounded (SMTP_REPLY_MAX bytes, the
 * first lines of a longer reply).
 *
 * Errors are negative errnos: -ETIMEDOUT (a deadline passed), -ECONNRESET (the server
 * closed the connection or it broke), -EPROTO (a reply that is not SMTP).
 */
#ifndef SLUICE_SMTP_CLIENT_H
#define SLUICE_SMTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "buf.h"
#include "smtp_reply.h"
#include "str.h"

#define SMTP_REPLY_MAX 4096

struct smtp_client {
	int fd;
	char *name;           /* the address connected to, for messages */
	struct smtp_ehlo ehlo; /* what the EHLO reply offered */
	int code;             /* the last reply's code, 0 if none */
	struct buf reply;     /* the last reply's lines, CR removed, each ending "\n" */
	FILE *trace;          /* -v: the dialogue goes there, or NULL */
	const char *trace_prefix;
	char in[4096];        /* bytes read and not yet used */
	size_t in_len, in_off;
	bool lost;            /* the connection broke: no more commands */
};

/*
 * Connect to addr, a socket string of sockspec.h ("unix:/path", "/path", "inet:host:port",
 * "inet:port@host", "inet6:[addr]:port", ...; a host name is resolved with getaddrinfo).  0, or a negative errno with err filled ("...: reason").
 */
int smtp_client_connect(struct smtp_client *c, const char *addr, int timeout_ms, char *err,
			size_t errlen);
void smtp_client_close(struct smtp_client *c);

/* Read one reply: its code (100..599), or a negative errno. */
int smtp_client_read_reply(struct smtp_client *c, int timeout_ms);
/* Send a command line (CRLF added) and read its reply: the code, or a negative errno. */
int smtp_client_command(struct smtp_client *c, int timeout_ms, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* EHLO name, and HELO if EHLO is refused with 5xx; fills ehlo.  The code. */
int smtp_client_hello(struct smtp_client *c, const char *name, int timeout_ms);
/* The message (CRLF lines), dot-stuffed, then ".": the code of the reply after the dot,
 * or a negative errno (*ret_sent tells whether the final dot was written). */
int smtp_client_data(struct smtp_client *c, struct str msg, int timeout_ms, bool *ret_sent);
/* QUIT, and a short wait for its reply; errors ignored. */
void smtp_client_quit(struct smtp_client *c);
/* Raw I/O for a relay (sendmail -bs): write all of p, or a negative errno. */
int smtp_client_write(struct smtp_client *c, const void *p, size_t n, int timeout_ms);

#endif
