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

static void control_input(struct session *s, struct evbuffer *in)
{
	struct daemon *d = service_arg(session_service(s));
	for (;;) {
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
		struct buf body;
		buf_init(&body, CONTROL_BODY_MAX);
		bool ok = false;
		if (daemon_control(d, req.argc, req.argv, &body, &ok) < 0) {
			buf_reset(&body);
			buf_append_cstr(&body, "internal error\n");
			ok = false;
		}
		send_reply(s, ok, buf_str(&body));
		buf_clear(&body);
		evbuffer_drain(in, used);
	}
}

static const struct service_ops control_ops = {
	.input = control_input,
	.refuse_msg = "error 17\ntoo many sessions",
};

struct service *control_service_new(struct engine *e, struct daemon *d)
{
	return service_new(e, "control", &control_ops, d);
}
