/*
 * control_service -- the control socket: requests in the control line protocol, answered
 * by daemon_control().  Sessions run on the worker loops like every other protocol.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <stdlib.h>

#include "control.h"
#include "control_service.h"
#include "daemon.h"

static void send_reply(struct session *s, bool ok, struct str body)
{
	struct buf out;
	buf_init(&out, CONTROL_BODY_MAX + 64);
	control_put_reply(&out, ok, body);
	session_write(s, out.ptr, out.len);
	buf_clear(&out);
}

/* A command waiting for the store: its reply buffer and the request's length. */
struct ctl_wait {
	struct control_wait w;
	struct session *s;
	struct evbuffer *in;
	struct buf body;
	bool ok;
	size_t used;
};

static void wait_done(struct control_wait *w)
{
	struct ctl_wait *cw = w->svc;
	struct session *s = cw->s;
	send_reply(s, cw->ok, buf_str(&cw->body));
	evbuffer_drain(cw->in, cw->used);
	buf_clear(&cw->body);
	session_set_data(s, NULL);
	struct daemon *d = service_arg(session_service(s));
	free(cw);
	if (daemon_stopping(d)) {
		session_close(s); /* answered; the daemon is on its way out */
		return;
	}
	session_resume(s); /* the next request, if one came meanwhile; may end the session */
}

static void control_close(struct session *s)
{
	struct ctl_wait *cw = session_data(s);
	if (!cw)
		return;
	if (cw->w.cancel)
		cw->w.cancel(&cw->w);
	buf_clear(&cw->body);
	free(cw);
}

static void control_input(struct session *s, struct evbuffer *in)
{
	struct daemon *d = service_arg(session_service(s));
	while (!session_data(s)) {
		size_t avail = evbuffer_get_length(in);
		if (avail == 0)
			return;
		size_t look = avail < CONTROL_LINE_MAX ? avail : CONTROL_LINE_MAX;
		const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)look);
		struct control_request req;
		size_t used;
		const char *why;
		int r = control_request_parse(p, look, &req, &used, &why);
		if (r == 0)
			return;
		if (r < 0) {
			send_reply(s, false, str_cstr(why));
			session_protocol_error(s, why);
			return;
		}
		struct ctl_wait *cw = calloc(1, sizeof(*cw));
		if (!cw) {
			session_protocol_error(s, "out of memory");
			return;
		}
		buf_init(&cw->body, CONTROL_BODY_MAX);
		cw->s = s;
		cw->in = in;
		cw->used = used;
		cw->w.out = &cw->body;
		cw->w.ok = &cw->ok;
		cw->w.done = wait_done;
		cw->w.svc = cw;
		r = daemon_control(d, req.argc, req.argv, &cw->body, &cw->ok, &cw->w);
		if (r == 1) {
			/* the request stays in the input until wait_done() answers it */
			session_set_data(s, cw);
			session_pause(s);
			return;
		}
		if (r < 0) {
			buf_reset(&cw->body);
			buf_append_cstr(&cw->body, "internal error\n");
			cw->ok = false;
		}
		send_reply(s, cw->ok, buf_str(&cw->body));
		buf_clear(&cw->body);
		free(cw);
		evbuffer_drain(in, used);
		if (daemon_stopping(d)) {
			session_close(s); /* answered; the daemon is on its way out */
			return;
		}
	}
}

static const struct service_ops control_ops = {
	.input = control_input,
	.close = control_close,
	.refuse_msg = "error 17\ntoo many sessions",
};

struct service *control_service_new(struct engine *e, struct daemon *d)
{
	return service_new(e, "control", &control_ops, d);
}
