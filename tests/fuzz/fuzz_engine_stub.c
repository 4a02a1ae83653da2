/*
 * fuzz_engine_stub -- a fake of the engine's session API (src/engine/engine.h) so that
 * fuzz_milter can drive the real milter session code (src/milter/milter_session.c)
 * without threads, sockets or event loops.
 *
 * One struct session holds the bytes the MTA sent and the session has not consumed (an
 * evbuffer handed to ops->input, as the engine does) and everything the session wrote.
 * The engine's rules are kept where the session code depends on them:
 *   - input is delivered only while the session is neither paused nor closing;
 *   - session_resume() delivers buffered input at once, unless called from inside
 *     ops->input;
 *   - session_close() and session_protocol_error() end the session; writes after that
 *     are dropped; ops->close runs exactly once, deferred while ops->input runs;
 *   - after ops->close the session is dead: any call into this API for it aborts (in the
 *     engine it would be a use after free, which ASan cannot see here because the stub
 *     keeps the memory until the harness frees it).
 */
#include <event2/buffer.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fuzz_engine_stub.h"


#define STUB_CHECK(x)                                                                  \
	do {                                                                            \
		if (!(x)) {                                                             \
			fprintf(stderr, "fuzz_engine_stub: %s:%d: check failed: %s\n",  \
				__FILE__, __LINE__, #x);                                \
			abort();                                                        \
		}                                                                       \
	} while (0)

struct service {
	char *name;
	const struct service_ops *ops;
	void *arg;
};

struct session {
	struct service *svc;
	void *data;
	struct evbuffer *in;
	struct evbuffer *out;
	bool opened;
	bool paused;
	bool closing;
	bool in_input;
	bool dead;	 /* a close was requested inside ops->input */
	bool closed;	 /* ops->close has run */
	bool proto_error;
};

struct service *service_new(struct engine *e, const char *name, const struct service_ops *ops,
			    void *arg)
{
	(void)e;
	struct service *svc = calloc(1, sizeof(*svc));
	if (!svc)
		return NULL;
	svc->name = strdup(name);
	if (!svc->name) {
		free(svc);
		return NULL;
	}
	svc->ops = ops;
	svc->arg = arg;
	return svc;
}

void fuzz_service_free(struct service *svc)
{
	if (!svc)
		return;
	if (svc->ops->free_arg)
		svc->ops->free_arg(svc->arg);
	free(svc->name);
	free(svc);
}

const char *service_name(const struct service *svc)
{
	return svc->name;
}

void *service_arg(const struct service *svc)
{
	return svc->arg;
}

static void alive(const struct session *s)
{
	STUB_CHECK(s);
	STUB_CHECK(!s->closed);
}

void *session_data(const struct session *s)
{
	alive(s);
	return s->data;
}

void session_set_data(struct session *s, void *data)
{
	alive(s);
	s->data = data;
}

struct service *session_service(const struct session *s)
{
	alive(s);
	return s->svc;
}

struct event_base *session_base(const struct session *s)
{
	alive(s);
	return NULL; /* no event loop here: the harness resumes deferred verdicts itself */
}

uint64_t session_id(const struct session *s)
{
	alive(s);
	return 1;
}

const char *session_peer(const struct session *s)
{
	alive(s);
	return "fuzz";
}

void session_log(struct session *s, enum log_level level, const char *fmt, ...)
{
	alive(s);
	/* Format every line, so that the sanitizers see the arguments; print nothing. */
	char line[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	(void)level;
}

/* ops->close once; deferred while ops->input runs, as in the engine. */
static void session_end(struct session *s)
{
	if (s->in_input) {
		s->dead = true;
		return;
	}
	if (s->closed)
		return;
	s->closing = true;
	if (s->opened && s->svc->ops->close)
		s->svc->ops->close(s);
	s->closed = true;
}

static void run_input(struct session *s)
{
	if (s->closed || s->paused || s->closing || s->in_input)
		return;
	if (evbuffer_get_length(s->in) == 0)
		return;
	s->in_input = true;
	s->svc->ops->input(s, s->in);
	s->in_input = false;
	if (s->dead) {
		s->dead = false;
		session_end(s);
	}
}

int session_write(struct session *s, const void *p, size_t n)
{
	alive(s);
	if (s->closing)
		return 0;
	if (evbuffer_add(s->out, p, n) < 0)
		return -1;
	return 0;
}

void session_pause(struct session *s)
{
	alive(s);
	s->paused = true;
}

void session_resume(struct session *s)
{
	alive(s);
	if (!s->paused)
		return;
	s->paused = false;
	if (!s->in_input)
		run_input(s);
}

void session_close(struct session *s)
{
	alive(s);
	if (s->closing)
		return;
	s->closing = true;
	session_end(s);
}

void session_protocol_error(struct session *s, const char *why)
{
	alive(s);
	STUB_CHECK(why && why[0]);
	s->proto_error = true;
	s->closing = true;
	session_end(s);
}

struct session *fuzz_session_open(struct service *svc)
{
	struct session *s = calloc(1, sizeof(*s));
	STUB_CHECK(s);
	s->svc = svc;
	s->in = evbuffer_new();
	s->out = evbuffer_new();
	STUB_CHECK(s->in && s->out);
	if (svc->ops->open && svc->ops->open(s) < 0) {
		s->closed = true;
		return s;
	}
	s->opened = true;
	return s;
}

void fuzz_session_feed(struct session *s, const void *p, size_t n)
{
	if (s->closed || s->closing)
		return;
	STUB_CHECK(evbuffer_add(s->in, p, n) == 0);
	run_input(s);
}

/* The peer hung up: the engine frees the session at once (ABORT + QUIT for milter). */
void fuzz_session_eof(struct session *s)
{
	STUB_CHECK(!s->in_input);
	if (!s->closed)
		session_end(s);
}

bool fuzz_session_ended(const struct session *s)
{
	return s->closed || s->closing;
}

bool fuzz_session_protocol_error(const struct session *s)
{
	return s->proto_error;
}

bool fuzz_session_paused(const struct session *s)
{
	return s->paused;
}

struct evbuffer *fuzz_session_input(struct session *s)
{
	return s->in;
}

struct evbuffer *fuzz_session_output(struct session *s)
{
	return s->out;
}

void fuzz_session_free(struct session *s)
{
	if (!s)
		return;
	STUB_CHECK(s->closed);
	evbuffer_free(s->in);
	evbuffer_free(s->out);
	free(s);
}
