/*
 * control_service -- the control socket: requests in the control line protocol, answered
 * by the owner's run() (control_service.h).  Sessions run on the worker loops like every
 * other protocol.
 *
 * Who may talk.  On a unix socket (checked at every request, with SO_PEERCRED; the socket
 * file's mode is the first barrier, this is the second and also covers a socket made 0666
 * by mistake): root, the daemon's own user and the members of the socket file's group;
 * anyone else gets an error reply and the connection is closed.  With control { admin =
 * "root"; } the group's members may only run the commands that change nothing.  An inet
 * peer carries no credentials: its first request must be control.h's "auth PASSWORD",
 * which the owner compares with the running configuration's passwords (password_file:
 * every command, as root on the unix socket; read_password_file: the commands that change
 * nothing, whatever admin says); a wrong password, a malformed one, or any other request
 * first gets an error reply, one log line with the peer's address (never the password),
 * and the connection is closed.  What an authenticated connection may run is kept for
 * its life: a reload that changes the passwords applies to the connections after it.
 * Which commands change nothing is the form a request is in control_cmds.c's table
 * (control_cmd_match()), never a word found among its arguments.
 *
 * A reply that grows with the queue streams (control.h's "more" parts): the command
 * gives its first part, then the session asks it for the next one whenever the peer has
 * taken what was written (less than STREAM_HIGH bytes wait in the output), a few parts
 * per turn of the loop so that the worker's other sessions are served in between.  The
 * request stays in the input, and the session reads nothing more, until the last part.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "control.h"
#include "control_cmds.h"
#include "control_service.h"

#define STREAM_HIGH (256 * 1024) /* output waiting for the peer before a stream pauses */
#define STREAM_PARTS 8           /* parts made per turn of the loop */
#define STREAM_POLL_MS 2         /* how often a paused stream looks at its output */

static void send_reply(struct session *s, bool ok, struct str body)
{
	struct buf out;
	buf_init(&out, CONTROL_BODY_MAX + 64);
	control_put_reply(&out, ok, body);
	session_write(s, out.ptr, out.len);
	buf_done(&out);
}

static void send_part(struct session *s, struct str body)
{
	if (body.len == 0)
		return;
	struct buf out;
	buf_init(&out, CONTROL_BODY_MAX + 64);
	control_put_part(&out, body);
	session_write(s, out.ptr, out.len);
	buf_done(&out);
}

/* A command waiting for the store, or streaming: its reply buffer and the request's
 * length. */
struct ctl_wait {
	struct control_wait w;
	struct session *s;
	struct evbuffer *in;
	struct buf body;
	bool ok;
	size_t used;
	struct event *pump; /* a streaming reply's next parts */
};

/* A control session: the command under way, and what an inet peer authenticated for. */
struct ctl_session {
	struct ctl_wait *cw; /* a command answering later or streaming; NULL between them */
	bool inet;           /* no peer credentials: the password decides */
	enum control_access inet_access;
};

static struct ctl_session *ctl_session(struct session *s)
{
	return session_data(s);
}

static void ctl_wait_free(struct ctl_wait *cw)
{
	if (cw->pump)
		event_free(cw->pump);
	buf_done(&cw->body);
	free(cw);
}

static void wait_done(struct control_wait *w)
{
	struct ctl_wait *cw = w->svc;
	struct session *s = cw->s;
	send_reply(s, cw->ok, buf_str(&cw->body));
	evbuffer_drain(cw->in, cw->used);
	ctl_session(s)->cw = NULL;
	const struct control_owner *cs = service_arg(session_service(s));
	ctl_wait_free(cw);
	if (cs->stopping(cs->arg)) {
		session_close(s); /* answered; the daemon is on its way out */
		return;
	}
	session_resume(s); /* the next request, if one came meanwhile; may end the session */
}

/* A streaming reply: the next parts while the peer keeps up, then wait for it. */
static void stream_pump(evutil_socket_t fd, short what, void *arg)
{
	struct ctl_wait *cw = arg;
	(void)fd;
	(void)what;
	struct timeval later = { 0, 0 };
	for (int k = 0; k < STREAM_PARTS; k++) {
		if (session_output_length(cw->s) > STREAM_HIGH) {
			later.tv_usec = STREAM_POLL_MS * 1000;
			break;
		}
		buf_reset(&cw->body);
		const struct control_owner *cs = service_arg(session_service(cw->s));
		int r;
		if (cs->stopping(cs->arg)) {
			/* a long listing does not hold the shutdown */
			if (cw->w.cancel)
				cw->w.cancel(&cw->w);
			buf_append_cstr(&cw->body, "sluiced is stopping: the reply is cut here\n");
			cw->ok = false;
			r = 0;
		} else {
			r = cw->w.step(&cw->w);
		}
		if (r < 0) {
			buf_reset(&cw->body);
			buf_append_cstr(&cw->body, "internal error\n");
			cw->ok = false;
		}
		if (r <= 0) {
			cw->w.cancel = NULL; /* the command is over: step freed its state */
			wait_done(&cw->w);
			return;
		}
		send_part(cw->s, buf_str(&cw->body));
	}
	event_add(cw->pump, &later);
}

static int control_open(struct session *s)
{
	struct ctl_session *cs = calloc(1, sizeof(*cs));
	if (!cs)
		return -ENOMEM;
	cs->inet = session_peer_addr(s)->sa_family != AF_UNIX;
	session_set_data(s, cs);
	return 0;
}

static void control_close(struct session *s)
{
	struct ctl_session *cs = ctl_session(s);
	if (!cs)
		return;
	struct ctl_wait *cw = cs->cw;
	if (cw) {
		if (cw->w.cancel)
			cw->w.cancel(&cw->w);
		ctl_wait_free(cw);
	}
	session_set_data(s, NULL);
	free(cs);
}

/* Is gid the peer's primary group or one of its supplementary groups? */
static bool peer_in_group(int fd, gid_t primary, gid_t gid)
{
	if (primary == gid)
		return true;
	gid_t groups[256];
	socklen_t len = sizeof(groups);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return false; /* XXX more than 256 groups (ERANGE): the primary group only */
	for (size_t i = 0; i < len / sizeof(groups[0]); i++)
		if (groups[i] == gid)
			return true;
	return false;
}

/* A unix peer's rights, from its credentials; who says who it is, for the log. */
static enum control_access peer_access(struct session *s, bool admin_root, char *who,
				       size_t wl)
{
	int fd = session_fd(s);
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
		snprintf(who, wl, "unknown peer");
		return CONTROL_ACCESS_DENIED;
	}
	snprintf(who, wl, "uid %lu", (unsigned long)cred.uid);
	if (cred.uid == 0 || cred.uid == geteuid())
		return CONTROL_ACCESS_ADMIN;
	/* the group of the socket file this connection came through */
	struct sockaddr_un sun;
	socklen_t sl = sizeof(sun);
	struct stat st;
	if (getsockname(fd, (struct sockaddr *)&sun, &sl) < 0 || sl <= sizeof(sa_family_t) ||
	    sun.sun_path[0] == '\0' || stat(sun.sun_path, &st) < 0)
		return CONTROL_ACCESS_DENIED;
	if (!peer_in_group(fd, cred.gid, st.st_gid))
		return CONTROL_ACCESS_DENIED;
	return admin_root ? CONTROL_ACCESS_READ : CONTROL_ACCESS_ADMIN;
}

/*
 * An "auth" request (parsed: r = 1 with the secret, or <0 with why).  An inet peer with
 * the right password gets its rights for the connection; a wrong or malformed one is
 * answered, logged once with the peer's address and the connection closed.  A unix
 * peer's credentials decide: it is told so.  Returns true when the session was closed.
 */
static bool control_auth(struct session *s, struct ctl_session *cs, int r, struct str secret,
			 const char *why)
{
	const struct control_owner *co = service_arg(session_service(s));
	if (!cs->inet) {
		send_reply(s, false, str_cstr("auth: this is a unix socket: the peer's credentials "
			   "decide, not a password\n"));
		return false;
	}
	enum control_access acc = r > 0 ? co->password_access(co->arg, secret)
					: CONTROL_ACCESS_DENIED;
	if (acc == CONTROL_ACCESS_DENIED) {
		session_log(s, LOG_LEVEL_WARNING, "control: refused: %s, closing",
			    r > 0 ? "wrong password" : why);
		send_reply(s, false, str_cstr(r > 0 ? "permission denied: wrong password\n"
						    : "permission denied: malformed auth request\n"));
		session_close(s);
		return true;
	}
	cs->inet_access = acc;
	bool admin = acc == CONTROL_ACCESS_ADMIN;
	session_log(s, LOG_LEVEL_DEBUG, "control: authenticated with the %s password",
		    admin ? "admin" : "read-only");
	send_reply(s, true, str_cstr(admin ? "authenticated: every command\n"
					   : "authenticated: the commands that change nothing\n"));
	return false;
}

static void control_input(struct session *s, struct evbuffer *in)
{
	const struct control_owner *co = service_arg(session_service(s));
	struct ctl_session *ss = ctl_session(s);
	while (!ss->cw) {
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
		char secret[CONTROL_SECRET_MAX];
		size_t slen = 0;
		r = control_auth_parse(&req, secret, &slen, &why);
		if (r != 0) {
			bool closed = control_auth(s, ss, r, str_make(secret, slen), why);
			explicit_bzero(secret, sizeof(secret));
			if (closed)
				return;
			evbuffer_drain(in, used);
			continue;
		}
		char who[80];
		enum control_access acc;
		if (ss->inet) {
			snprintf(who, sizeof(who), "inet peer %.40s", session_peer(s));
			acc = ss->inet_access;
		} else {
			acc = peer_access(s, co->admin_root(co->arg), who, sizeof(who));
		}
		if (acc == CONTROL_ACCESS_DENIED && ss->inet) {
			session_log(s, LOG_LEVEL_WARNING, "control: refused: no password given, "
				    "closing");
			send_reply(s, false, str_cstr("permission denied: this control socket takes "
				   "a password first (sluice --password-file FILE, or "
				   "SLUICE_CONTROL_PASSWORD)\n"));
			session_close(s);
			return;
		}
		if (acc == CONTROL_ACCESS_DENIED) {
			log_warning("control: %s refused: not root, the daemon's user or a member of "
				    "the control socket's group", who);
			send_reply(s, false, str_cstr("permission denied: only root, sluiced's user "
				   "and the control socket's group may use it\n"));
			session_close(s);
			return;
		}
		/* the form by position, from the command table: a reader runs only the forms
		 * that change nothing, and none the table does not know */
		const struct control_cmd *form = NULL;
		int m = control_cmd_match(req.argc, req.argv, &form);
		if (acc == CONTROL_ACCESS_READ && (m < 0 || (form->flags & CONTROL_CMD_CHANGES))) {
			char q[64];
			log_notice("control: %s: \"%s\" refused (%s)", who,
				   log_quote(q, sizeof(q), req.argv[0], 20),
				   ss->inet ? "the read-only password" : "admin = \"root\"");
			send_reply(s, false, str_cstr(m < 0 ? "permission denied: no such command "
				   "form (try help)\n" : ss->inet ? "permission denied: this command "
				   "changes sluiced's state, and the password given is "
				   "control.read_password_file's\n" : "permission denied: this command "
				   "changes sluiced's state and control.admin is \"root\": run it as "
				   "root\n"));
			evbuffer_drain(in, used);
			continue;
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
		cw->w.worker = session_worker(s);
		r = co->run(co->arg, req.argc, req.argv, &cw->body, &cw->ok, &cw->w);
		if (r == 2) {
			/* a stream: its first part now, the others from stream_pump() */
			cw->pump = event_new(session_base(s), -1, 0, stream_pump, cw);
			if (!cw->pump) {
				if (cw->w.cancel)
					cw->w.cancel(&cw->w);
				ctl_wait_free(cw);
				session_protocol_error(s, "out of memory");
				return;
			}
			send_part(s, buf_str(&cw->body));
			ss->cw = cw;
			session_pause(s);
			struct timeval now = { 0, 0 };
			event_add(cw->pump, &now);
			return;
		}
		if (r == 1) {
			/* the request stays in the input until wait_done() answers it */
			ss->cw = cw;
			session_pause(s);
			return;
		}
		if (r < 0) {
			buf_reset(&cw->body);
			buf_append_cstr(&cw->body, "internal error\n");
			cw->ok = false;
		}
		send_reply(s, cw->ok, buf_str(&cw->body));
		buf_done(&cw->body);
		free(cw);
		evbuffer_drain(in, used);
		if (co->stopping(co->arg)) {
			session_close(s); /* answered; the daemon is on its way out */
			return;
		}
	}
}

static const struct service_ops control_ops = {
	.open = control_open,
	.input = control_input,
	.close = control_close,
	.refuse_msg = "error 17\ntoo many sessions",
};

struct service *control_service_new(struct engine *e, const struct control_owner *owner)
{
	return service_new(e, "control", &control_ops, (void *)owner);
}
