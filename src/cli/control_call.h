/*
 * control_call -- one request to sluiced's control socket and its reply, for the sluice
 * command and `sluice top` (blocking; the command has nothing else to do meanwhile).
 */
#ifndef SLUICE_CONTROL_CALL_H
#define SLUICE_CONTROL_CALL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

/*
 * Write req (len bytes) to fd and read one reply (at most CONTROL_BODY_MAX).  0 with the
 * reply's body in body (NUL-terminated) and *ret_ok telling whether sluiced answered ok;
 * or -EPIPE (sluiced closed the connection), -EPROTO (a bad reply: *ret_why says why),
 * -EMSGSIZE (the reply is too large), -EINTR (*stop was set by a signal; stop may be
 * NULL), or another -errno from write or read.
 */
int control_call(int fd, const char *req, size_t len, struct buf *body, bool *ret_ok,
		 const char **ret_why, volatile sig_atomic_t *stop);
/*
 * The same for a reply that may stream (control.h's "more" parts): each part's body is
 * passed to part(arg, p, n) as it comes, and body gets the last frame's only.  part may
 * be NULL: the parts are then gathered in body before the last (up to its limit).
 */
int control_call_parts(int fd, const char *req, size_t len,
		       void (*part)(void *arg, const char *p, size_t n), void *arg,
		       struct buf *body, bool *ret_ok, const char **ret_why,
		       volatile sig_atomic_t *stop);

#endif
