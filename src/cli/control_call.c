/*
 * control_call -- see control_call.h.  The framing is proto/control's; this file only
 * moves bytes.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "control.h"
#include "control_call.h"

static int send_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == ECONNRESET ? -EPIPE : -errno;
		if (n == 0)
			return -EPIPE;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int control_call(int fd, const char *req, size_t len, struct buf *body, bool *ret_ok,
		 const char **ret_why, volatile sig_atomic_t *stop)
{
	return control_call_parts(fd, req, len, NULL, NULL, body, ret_ok, ret_why, stop);
}

int control_call_parts(int fd, const char *req, size_t len,
		       void (*part)(void *arg, const char *p, size_t n), void *arg,
		       struct buf *body, bool *ret_ok, const char **ret_why,
		       volatile sig_atomic_t *stop)
{
	int r = send_all(fd, req, len);
	if (r < 0)
		return r;
	struct buf in;
	buf_init(&in, CONTROL_BODY_MAX + 64);
	size_t gathered = 0; /* parts gathered in body (part == NULL) */
	buf_reset(body);
	for (;;) {
		struct control_reply rep;
		size_t used;
		const char *why;
		int pr = control_reply_parse(in.ptr ? in.ptr : "", in.len, &rep, &used, &why);
		if (pr < 0) {
			*ret_why = why;
			r = -EPROTO;
			break;
		}
		if (pr == 1 && rep.more) {
			if (part) {
				part(arg, rep.body.ptr, rep.body.len);
			} else if (buf_append(body, rep.body.ptr, rep.body.len) < 0) {
				r = -EMSGSIZE;
				break;
			}
			gathered = body->len;
			/* what follows the part moves to the front */
			memmove(in.ptr, in.ptr + used, in.len - used);
			buf_truncate(&in, in.len - used);
			continue;
		}
		if (pr == 1) {
			buf_truncate(body, gathered);
			r = buf_append(body, rep.body.ptr, rep.body.len);
			if (r == 0)
				r = buf_append_byte(body, '\0');
			if (r == 0) {
				body->len--; /* the NUL is not part of the body */
				*ret_ok = rep.ok;
			}
			break;
		}
		char tmp[65536];
		ssize_t n = read(fd, tmp, sizeof(tmp));
		if (n < 0 && errno == EINTR) {
			if (stop && *stop) {
				r = -EINTR;
				break;
			}
			continue;
		}
		if (n <= 0) {
			r = n < 0 && errno != ECONNRESET ? -errno : -EPIPE;
			break;
		}
		if (buf_append(&in, tmp, (size_t)n) < 0) {
			r = -EMSGSIZE;
			break;
		}
	}
	buf_done(&in);
	return r;
}
