/*
 * test_milter_session -- milter sessions on the real engine (src/milter/milter_session.c
 * over src/engine/engine.c), with the test acting as the MTA.
 *
 * Each test starts an engine with one worker thread and a milter service listening on a
 * unix socket in a fresh mkdtemp() directory; the main event base (listeners) is stepped
 * from the test thread while it connects.  The handler is written here: what it wants,
 * its verdicts and the steps it defers are set per test, and it records every call in a
 * text log ("step(details) macros;"), which the tests compare after each exchange.  The
 * test speaks the wire protocol through blocking sockets and checks every reply packet,
 * that no extra reply follows (a short poll() timeout), and the handler's call counts.
 *
 * Handler callbacks run on the worker thread: they only record (under a mutex or with
 * atomics); all assertions are made on the test thread.
 */
#include <errno.h>
#include <event2/event.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.h"
#include "log.h"
#include "milter.h"
#include "milter_session.h"
#include "milter_static.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define LIT(s) s, sizeof(s) - 1
#define STEP(s) MILTER_STEP_BIT(MILTER_STEP_##s)
#define ALL_STEPS ((1u << MILTER_STEP_COUNT) - 1)

/* The MTAs' offers (MILTER-PROTOCOL.md §3.1). */
#define PF_ACTS 0x1ffu
#define PF_PROTO 0x1fffffu

/* ---- captured log lines ----------------------------------------------------------- */

static pthread_mutex_t logcap_lock = PTHREAD_MUTEX_INITIALIZER;
static char logcap[65536];
static size_t logcap_len;

static void logcap_sink(enum log_level level, const char *line)
{
	(void)level;
	pthread_mutex_lock(&logcap_lock);
	int w = snprintf(logcap + logcap_len, sizeof(logcap) - logcap_len, "%s\n", line);
	if (w > 0 && (size_t)w < sizeof(logcap) - logcap_len)
		logcap_len += (size_t)w;
	pthread_mutex_unlock(&logcap_lock);
}

static bool logcap_contains(const char *s)
{
	pthread_mutex_lock(&logcap_lock);
	bool r = strstr(logcap, s) != NULL;
	pthread_mutex_unlock(&logcap_lock);
	return r;
}

/* ---- the test handler ------------------------------------------------------------- */

struct th;

struct pend {
	struct th *th;
	struct milter_session *ms;
	struct event *ev;
	enum milter_verdict v;
};

struct th {
	/* configuration, set by the test before the MTA negotiates */
	struct milter_want want;
	enum milter_verdict verdict[MILTER_STEP_COUNT];
	const char *reply[MILTER_STEP_COUNT];
	unsigned pending_ms[MILTER_STEP_COUNT]; /* > 0: defer, then resume with verdict[] */
	unsigned delay_ms[MILTER_STEP_COUNT];   /* > 0: milter_session_delay() at the step */
	bool progress_before_resume;
	bool eom_mods;	/* run the modification list at EOM */
	bool try_mods;	/* run it at every other step too */
	bool verbose;	/* add the connection data at MAIL */
	const char *lookups; /* macro names looked up at every step */
	/* records */
	pthread_mutex_t lock;
	char log[16384];
	size_t loglen;
	_Atomic unsigned steps[MILTER_STEP_COUNT];
	_Atomic unsigned aborts, closes, destroyed;
	struct pend *pend; /* the deferred verdict, if any (worker thread only) */
};

static void th_printf(struct th *th, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void th_printf(struct th *th, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&th->lock);
	va_start(ap, fmt);
	int w = vsnprintf(th->log + th->loglen, sizeof(th->log) - th->loglen, fmt, ap);
	va_end(ap);
	if (w > 0 && (size_t)w < sizeof(th->log) - th->loglen)
		th->loglen += (size_t)w;
	pthread_mutex_unlock(&th->lock);
}

static void th_want(void *ctx, struct milter_want *ret)
{
	struct th *th = ctx;
	*ret = th->want;
}

/* The modifications, in this order; results recorded as "mods=r0,r1,...". */
static void th_mods(struct th *th, struct milter_session *ms, bool eom)
{
	int r[11];
	r[0] = milter_session_add_header(ms, str_cstr("X-Test"), str_cstr("1"));
	r[1] = milter_session_insert_header(ms, 0, str_cstr("X-First"), str_cstr("top"));
	r[2] = milter_session_change_header(ms, 2, str_cstr("Subject"), str_make("", 0));
	r[3] = milter_session_add_rcpt(ms, str_cstr("<new@example.org>"), STR_NULL);
	r[4] = milter_session_add_rcpt(ms, str_cstr("<par@example.org>"), str_cstr("NOTIFY=NEVER"));
	r[5] = milter_session_del_rcpt(ms, str_cstr("<old@example.org>"));
	r[6] = milter_session_change_from(ms, str_cstr("<from@example.org>"), str_cstr("RET=HDRS"));
	r[7] = milter_session_quarantine(ms, str_cstr("held for review"));
	/* PROGRESS only where the MTA waits for an answer */
	r[8] = eom ? milter_session_progress(ms) : 0;
	r[9] = milter_session_replace_body(ms, str_cstr("new body\r\n"));
	r[10] = milter_session_add_header(ms, str_make("", 0), str_cstr("x"));
	th_printf(th, " mods=%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", r[0], r[1], r[2], r[3], r[4], r[5],
		  r[6], r[7], r[8], r[9], r[10]);
}

static void th_str(struct th *th, struct str s)
{
	th_printf(th, "%.*s", (int)s.len, s.ptr ? s.ptr : "");
}

static void pend_fire(evutil_socket_t fd, short what, void *arg)
{
	struct pend *p = arg;
	(void)fd;
	(void)what;
	p->th->pend = NULL;
	th_printf(p->th, "resume(%s);", milter_verdict_name(p->v));
	if (p->th->progress_before_resume)
		milter_session_progress(p->ms);
	struct milter_session *ms = p->ms;
	struct th *th = p->th;
	enum milter_verdict v = p->v;
	event_free(p->ev);
	free(p);
	/* input that arrived meanwhile is handled inside this call, and may end the session:
	 * ms must not be used after it */
	milter_session_resume(ms, v);
	th_printf(th, "resumed;");
}

static enum milter_verdict th_step(void *ctx, struct milter_session *ms)
{
	struct th *th = ctx;
	enum milter_step step = milter_session_step(ms);
	atomic_fetch_add(&th->steps[step], 1);
	th_printf(th, "%s", milter_step_name(step));
	switch (step) {
	case MILTER_STEP_CONNECT: {
		th_printf(th, "(");
		th_str(th, milter_session_client_host(ms));
		th_printf(th, ",%c,%u,", milter_session_client_family(ms) ? milter_session_client_family(ms) : '0',
			  milter_session_client_port(ms));
		th_str(th, milter_session_client_addr(ms));
		th_printf(th, ",helo=");
		th_str(th, milter_session_helo(ms));
		th_printf(th, ")");
		break;
	}
	case MILTER_STEP_HELO:
		th_printf(th, "(");
		th_str(th, milter_session_helo(ms));
		th_printf(th, ")");
		break;
	case MILTER_STEP_MAIL:
	case MILTER_STEP_RCPT: {
		th_printf(th, "(");
		th_str(th, step == MILTER_STEP_MAIL ? milter_session_sender(ms) : milter_session_rcpt(ms));
		const struct str *args;
		size_t n = milter_session_esmtp_args(ms, &args);
		for (size_t i = 0; i < n; i++) {
			th_printf(th, " ");
			th_str(th, args[i]);
		}
		if (step == MILTER_STEP_RCPT)
			th_printf(th, " #%u", milter_session_rcpt_count(ms));
		if (step == MILTER_STEP_MAIL && th->verbose) {
			th_printf(th, " | ");
			th_str(th, milter_session_client_host(ms));
			th_printf(th, " ");
			th_str(th, milter_session_client_addr(ms));
			th_printf(th, " ");
			th_str(th, milter_session_helo(ms));
		}
		th_printf(th, ")");
		break;
	}
	case MILTER_STEP_HEADER:
		th_printf(th, "(");
		th_str(th, milter_session_header_name(ms));
		th_printf(th, "=");
		th_str(th, milter_session_header_value(ms));
		th_printf(th, ")");
		break;
	case MILTER_STEP_BODY:
		th_printf(th, "(%zu)", milter_session_body_chunk(ms).len);
		break;
	case MILTER_STEP_EOM:
		th_printf(th, "(%llu)", (unsigned long long)milter_session_body_size(ms));
		break;
	case MILTER_STEP_UNKNOWN:
		th_printf(th, "(");
		th_str(th, milter_session_unknown(ms));
		th_printf(th, ")");
		break;
	default:
		break;
	}
	if (th->lookups) {
		char names[256];
		snprintf(names, sizeof(names), "%s", th->lookups);
		char *save = NULL;
		for (char *n = strtok_r(names, " ", &save); n; n = strtok_r(NULL, " ", &save)) {
			struct str v;
			if (milter_session_macro(ms, n, &v)) {
				th_printf(th, " %s=", n);
				th_str(th, v);
			} else {
				th_printf(th, " %s-", n);
			}
		}
	}
	if ((step == MILTER_STEP_EOM && th->eom_mods) || (step != MILTER_STEP_EOM && th->try_mods))
		th_mods(th, ms, step == MILTER_STEP_EOM);
	if (th->reply[step] && milter_session_set_reply(ms, str_cstr(th->reply[step])) < 0)
		th_printf(th, " bad-reply");
	if (th->delay_ms[step]) {
		milter_session_delay(ms, th->delay_ms[step]);
		th_printf(th, " delay");
	}
	if (th->pending_ms[step]) {
		struct pend *p = calloc(1, sizeof(*p));
		if (p) {
			p->th = th;
			p->ms = ms;
			p->v = th->verdict[step];
			p->ev = evtimer_new(session_base(milter_session_session(ms)), pend_fire, p);
			struct timeval tv = { .tv_sec = th->pending_ms[step] / 1000,
					      .tv_usec = (suseconds_t)(th->pending_ms[step] % 1000) * 1000 };
			if (p->ev && evtimer_add(p->ev, &tv) == 0) {
				th->pend = p;
				th_printf(th, " pending;");
				return MILTER_PENDING;
			}
			if (p->ev)
				event_free(p->ev);
			free(p);
		}
		th_printf(th, " no-timer");
	}
	th_printf(th, ";");
	return th->verdict[step];
}

static void th_abort(void *ctx, struct milter_session *ms)
{
	struct th *th = ctx;
	(void)ms;
	atomic_fetch_add(&th->aborts, 1);
	th_printf(th, "abort;");
}

static void th_close(void *ctx, struct milter_session *ms)
{
	struct th *th = ctx;
	atomic_fetch_add(&th->closes, 1);
	th_printf(th, "close;");
	/* a deferred verdict must not outlive its session */
	if (th->pend && th->pend->ms == ms) {
		event_free(th->pend->ev);
		free(th->pend);
		th->pend = NULL;
	}
}

static void th_destroy(void *ctx)
{
	struct th *th = ctx;
	atomic_store(&th->destroyed, 1);
}

static struct milter_handler *th_handler(struct th *th)
{
	struct milter_handler *h = calloc(1, sizeof(*h));
	assert_non_null(h);
	h->name = "test";
	h->want = th_want;
	for (int i = 0; i < MILTER_STEP_COUNT; i++)
		h->on_step[i] = th_step;
	h->on_abort = th_abort;
	h->on_close = th_close;
	h->destroy = th_destroy;
	h->ctx = th;
	atomic_init(&h->refs, 1);
	return h;
}

/* ---- fixture ---------------------------------------------------------------------- */

struct fixture {
	char dir[64];
	char path[96];
	struct event_base *main_base;
	struct engine *e;
	struct service *svc;
	struct th *th;
	int fds[16];
	size_t nfds;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	pthread_mutex_lock(&logcap_lock);
	logcap_len = 0;
	logcap[0] = '\0';
	pthread_mutex_unlock(&logcap_lock);
	log_set_sink(logcap_sink);
	snprintf(f->dir, sizeof(f->dir), "/tmp/sluice-test-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/milter.sock", f->dir);
	f->main_base = event_base_new();
	assert_non_null(f->main_base);
	f->e = engine_new(1, f->main_base);
	assert_non_null(f->e);
	f->th = calloc(1, sizeof(*f->th));
	assert_non_null(f->th);
	pthread_mutex_init(&f->th->lock, NULL);
	struct milter_service_conf conf = { .max_packet = MILTER_LEN_CAP_DEFAULT,
					    .max_macros = 256 * 1024 };
	f->svc = milter_service_new(f->e, th_handler(f->th), &conf);
	assert_non_null(f->svc);
	/* as the daemon does: reading never stops inside one packet */
	struct service_limits lim = { .max_sessions = 0,
				      .idle_timeout_ms = 60000,
				      .command_timeout_ms = 60000,
				      .max_input = MILTER_LEN_CAP_DEFAULT + 65536 };
	service_set_limits(f->svc, &lim);
	char addr[160], err[256];
	snprintf(addr, sizeof(addr), "unix:%s", f->path);
	if (service_listen(f->svc, addr, 0600, err, sizeof(err)) < 0)
		fail_msg("service_listen: %s", err);
	assert_int_equal(engine_start(f->e), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	for (size_t i = 0; i < f->nfds; i++)
		if (f->fds[i] >= 0)
			close(f->fds[i]);
	engine_free(f->e);
	event_base_free(f->main_base);
	rmdir(f->dir);
	/* the service held the only reference to the handler */
	assert_int_equal(atomic_load(&f->th->destroyed), 1);
	pthread_mutex_destroy(&f->th->lock);
	free(f->th);
	free(f);
	log_set_sink(NULL);
	return 0;
}

static uint64_t now_ms_test(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Polls cond for up to 3 s. */
#define WAIT_FOR(cond)                                                              \
	do {                                                                         \
		uint64_t t0_ = now_ms_test();                                        \
		while (!(cond) && now_ms_test() - t0_ < 3000)                        \
			usleep(1000);                                                \
		if (!(cond))                                                         \
			fail_msg("timed out waiting for %s", #cond);                 \
	} while (0)

static uint64_t stat_connections(struct fixture *f)
{
	struct service_stats st;
	service_stats(f->svc, false, &st);
	return st.total.connections;
}

static uint64_t stat_protocol_errors(struct fixture *f)
{
	struct service_stats st;
	service_stats(f->svc, false, &st);
	return st.total.protocol_errors;
}

static uint64_t stat_sessions_ended(struct fixture *f)
{
	struct service_stats st;
	service_stats(f->svc, false, &st);
	return st.total.sessions;
}

/* Connects as an MTA; steps the main base until the engine has accepted. */
static int mta_open(struct fixture *f)
{
	uint64_t before = stat_connections(f);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", f->path);
	assert_int_equal(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	uint64_t t0 = now_ms_test();
	while (stat_connections(f) == before && now_ms_test() - t0 < 3000) {
		event_base_loop(f->main_base, EVLOOP_NONBLOCK);
		usleep(500);
	}
	assert_true(stat_connections(f) > before);
	assert_true(f->nfds < ARRAY_SIZE(f->fds));
	f->fds[f->nfds++] = fd;
	return fd;
}

static void mta_close(struct fixture *f, int fd)
{
	for (size_t i = 0; i < f->nfds; i++)
		if (f->fds[i] == fd)
			f->fds[i] = -1;
	close(fd);
}

/* Several packets, written at once. */
struct wire {
	unsigned char *p;
	size_t len, cap;
};

static void wire_add(struct wire *w, uint8_t code, const void *data, size_t len)
{
	if (w->len + len + 5 > w->cap) {
		size_t cap = w->cap ? w->cap : 1024;
		while (cap < w->len + len + 5)
			cap *= 2;
		w->p = realloc(w->p, cap);
		assert_non_null(w->p);
		w->cap = cap;
	}
	uint32_t l = (uint32_t)len + 1;
	unsigned char *o = w->p + w->len;
	o[0] = (unsigned char)(l >> 24);
	o[1] = (unsigned char)(l >> 16);
	o[2] = (unsigned char)(l >> 8);
	o[3] = (unsigned char)l;
	o[4] = code;
	if (len)
		memcpy(o + 5, data, len);
	w->len += len + 5;
}

static void wire_raw(struct wire *w, const void *data, size_t len)
{
	if (w->len + len > w->cap) {
		size_t cap = w->cap ? w->cap : 1024;
		while (cap < w->len + len)
			cap *= 2;
		w->p = realloc(w->p, cap);
		assert_non_null(w->p);
		w->cap = cap;
	}
	memcpy(w->p + w->len, data, len);
	w->len += len;
}

/* A command whose payload is one NUL-terminated string. */
static void wire_str(struct wire *w, uint8_t code, const char *s)
{
	wire_add(w, code, s, strlen(s) + 1);
}

static void wire_connect(struct wire *w, const char *host, char family, uint16_t port, const char *addr)
{
	char b[512];
	size_t n = strlen(host) + 1;
	assert_true(n + strlen(addr) + 4 < sizeof(b));
	memcpy(b, host, n);
	b[n++] = family;
	b[n++] = (char)(port >> 8);
	b[n++] = (char)port;
	memcpy(b + n, addr, strlen(addr) + 1);
	n += strlen(addr) + 1;
	wire_add(w, 'C', b, n);
}

static void wire_header(struct wire *w, const char *name, const char *value)
{
	char b[1024];
	int n = snprintf(b, sizeof(b), "%s%c%s", name, 0, value);
	assert_true(n > 0 && (size_t)n + 1 < sizeof(b));
	wire_add(w, 'L', b, (size_t)n + 1);
}

static void wire_optneg(struct wire *w, uint32_t v, uint32_t a, uint32_t p)
{
	unsigned char b[12];
	uint32_t x[3] = { v, a, p };
	for (int i = 0; i < 3; i++) {
		b[4 * i] = (unsigned char)(x[i] >> 24);
		b[4 * i + 1] = (unsigned char)(x[i] >> 16);
		b[4 * i + 2] = (unsigned char)(x[i] >> 8);
		b[4 * i + 3] = (unsigned char)x[i];
	}
	wire_add(w, 'O', b, 12);
}

static void wire_send(int fd, struct wire *w)
{
	size_t off = 0;
	while (off < w->len) {
		ssize_t n = send(fd, w->p + off, w->len - off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* the peer closed: the test checks for EOF */
		off += (size_t)n;
	}
	free(w->p);
	*w = (struct wire){ 0 };
}

/* One command, sent on its own. */
static void mta_cmd(int fd, uint8_t code, const void *data, size_t len)
{
	struct wire w = { 0 };
	wire_add(&w, code, data, len);
	wire_send(fd, &w);
}

static void mta_str(int fd, uint8_t code, const char *s)
{
	mta_cmd(fd, code, s, strlen(s) + 1);
}

/* Reads exactly n bytes within timeout_ms: 1, 0 on timeout (nothing read), -1 on EOF. */
static int read_full(int fd, void *buf, size_t n, int timeout_ms)
{
	size_t got = 0;
	uint64_t t0 = now_ms_test();
	while (got < n) {
		int left = timeout_ms - (int)(now_ms_test() - t0);
		if (left < 0)
			left = 0;
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int r = poll(&pfd, 1, left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0) {
			if (got == 0)
				return 0;
			fail_msg("partial reply: %zu of %zu bytes", got, n);
		}
		ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (got)
				fail_msg("EOF inside a reply");
			return -1;
		}
		got += (size_t)k;
	}
	return 1;
}

struct reply {
	uint8_t code;
	size_t len;
	char data[1 << 17];
};

/* One reply packet: 1, 0 on timeout, -1 on EOF. */
static int mta_read(int fd, int timeout_ms, struct reply *r)
{
	unsigned char h[5];
	int k = read_full(fd, h, 5, timeout_ms);
	if (k <= 0)
		return k;
	uint32_t len = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
	if (len == 0 || len - 1 > sizeof(r->data))
		fail_msg("reply length %u", len);
	r->code = h[4];
	r->len = len - 1;
	if (r->len && read_full(fd, r->data, r->len, 2000) != 1)
		fail_msg("reply payload missing");
	return 1;
}

static struct reply *reply_new(void)
{
	struct reply *r = malloc(sizeof(*r));
	assert_non_null(r);
	return r;
}

/* Expects one reply with this code; replies without payload must have none. */
static void expect_reply_data(int fd, uint8_t code, const void *data, size_t len)
{
	struct reply *r = reply_new();
	int k = mta_read(fd, 3000, r);
	if (k != 1)
		fail_msg("expected reply '%c', got %s", code, k == 0 ? "nothing" : "EOF");
	if (r->code != code)
		fail_msg("expected reply '%c', got '%c' (%zu bytes)", code, r->code, r->len);
	if (data && (r->len != len || memcmp(r->data, data, len) != 0))
		fail_msg("reply '%c': payload differs (%zu bytes, expected %zu): %.*s", code, r->len,
			 len, (int)r->len, r->data);
	free(r);
}

/* A reply without payload. */
static void expect_reply(int fd, uint8_t code)
{
	expect_reply_data(fd, code, "", 0);
}

/* Nothing more arrives within a short time. */
static void expect_silence(int fd, int ms)
{
	struct reply *r = reply_new();
	int k = mta_read(fd, ms, r);
	if (k == 1)
		fail_msg("unexpected reply '%c' (%zu bytes)", r->code, r->len);
	if (k < 0)
		fail_msg("unexpected EOF");
	free(r);
}

static void expect_eof(int fd)
{
	struct reply *r = reply_new();
	int k = mta_read(fd, 3000, r);
	if (k == 1)
		fail_msg("expected EOF, got reply '%c'", r->code);
	if (k == 0)
		fail_msg("expected EOF, the connection stays open");
	free(r);
}

struct optneg {
	uint32_t version, actions, protocol;
	size_t extra_len;
	char extra[512];
};

/* Negotiates; returns the filter's answer. */
static struct optneg mta_optneg(int fd, uint32_t v, uint32_t a, uint32_t p)
{
	struct wire w = { 0 };
	wire_optneg(&w, v, a, p);
	wire_send(fd, &w);
	struct reply *r = reply_new();
	if (mta_read(fd, 3000, r) != 1)
		fail_msg("no OPTNEG reply");
	assert_int_equal(r->code, 'O');
	assert_true(r->len >= 12 && r->len - 12 <= sizeof(((struct optneg *)0)->extra));
	const unsigned char *d = (const unsigned char *)r->data;
	struct optneg o = {
		.version = (uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | d[3],
		.actions = (uint32_t)d[4] << 24 | (uint32_t)d[5] << 16 | (uint32_t)d[6] << 8 | d[7],
		.protocol = (uint32_t)d[8] << 24 | (uint32_t)d[9] << 16 | (uint32_t)d[10] << 8 | d[11],
		.extra_len = r->len - 12,
	};
	memcpy(o.extra, r->data + 12, o.extra_len);
	free(r);
	return o;
}

/* The handler's log so far, compared and cleared; waits a little for worker-side calls. */
static void expect_log(struct th *th, const char *expect)
{
	uint64_t t0 = now_ms_test();
	for (;;) {
		pthread_mutex_lock(&th->lock);
		bool same = strcmp(th->log, expect) == 0;
		if (same || now_ms_test() - t0 > 2000) {
			if (!same) {
				char got[sizeof(th->log)];
				memcpy(got, th->log, sizeof(got));
				pthread_mutex_unlock(&th->lock);
				fail_msg("handler log\n  got      %s\n  expected %s", got, expect);
			}
			th->loglen = 0;
			th->log[0] = '\0';
			pthread_mutex_unlock(&th->lock);
			return;
		}
		pthread_mutex_unlock(&th->lock);
		usleep(1000);
	}
}

static void want_all(struct th *th, uint32_t replies)
{
	th->want.steps = ALL_STEPS;
	th->want.replies = replies;
}

/* ---- negotiation ------------------------------------------------------------------ */

static void test_negotiated_reply(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want = (struct milter_want){
		.steps = STEP(CONNECT) | STEP(HELO) | STEP(MAIL) | STEP(RCPT) | STEP(EOH),
		.replies = STEP(CONNECT) | STEP(RCPT),
		.actions = MILTER_ACT_ADDHDRS | MILTER_ACT_CHGFROM,
		.header_leadspc = true,
		.macros = { [MILTER_MACROS_CONNECT] = "{client_addr} j" },
	};
	static const char list[] = "\0\0\0\0{client_addr} j";
	static const struct {
		uint32_t v, a, p;
		uint32_t rv, ra, rp;
		bool lists;
	} cases[] = {
		/* Postfix 6: skip DATA, HEADER, BODY, UNKNOWN; no reply to HELO, MAIL, EOH */
		{ 6, PF_ACTS, PF_PROTO, 6, 0x141, 0x330 | 0x46000 | MILTER_P_HDR_LEADSPC, true },
		/* Sendmail with 1M data */
		{ 6, PF_ACTS, PF_PROTO | MILTER_P_MDS_1M, 6, 0x141,
		  0x330 | 0x46000 | MILTER_P_HDR_LEADSPC | MILTER_P_MDS_1M, true },
		/* Postfix milter_protocol=2: skip bits only, no NR, no HDR_LEADSPC */
		{ 2, PF_ACTS, 0x7f, 2, 0x141, 0x30, true },
		/* milter_protocol=4 */
		{ 4, PF_ACTS, 0x37f, 4, 0x141, 0x330, true },
		/* no SETSYMLIST offered: no lists */
		{ 6, 0xff, PF_PROTO, 6, 0x41, 0x330 | 0x46000 | MILTER_P_HDR_LEADSPC, false },
		/* a very old MTA: zero words read as the v1 defaults */
		{ 2, 0, 0, 2, MILTER_ACT_ADDHDRS, 0x30, false },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		int fd = mta_open(f);
		struct optneg o = mta_optneg(fd, cases[i].v, cases[i].a, cases[i].p);
		if (o.version != cases[i].rv || o.actions != cases[i].ra || o.protocol != cases[i].rp)
			fail_msg("case %zu: got %u 0x%x 0x%x, expected %u 0x%x 0x%x", i, o.version,
				 o.actions, o.protocol, cases[i].rv, cases[i].ra, cases[i].rp);
		if (cases[i].lists) {
			assert_int_equal(o.extra_len, sizeof(list));
			assert_memory_equal(o.extra, list, sizeof(list));
		} else {
			assert_int_equal(o.extra_len, 0);
		}
		expect_silence(fd, 50);
		mta_close(f, fd);
	}
	/* version 1: refused, the connection is closed without an answer */
	int fd = mta_open(f);
	struct wire w = { 0 };
	wire_optneg(&w, 1, PF_ACTS, 0x3f);
	wire_send(fd, &w);
	expect_eof(fd);
	WAIT_FOR(stat_protocol_errors(f) == 1);
	assert_true(logcap_contains("MTA protocol version below 2"));
	expect_log(th, "");
}

/*
 * Steps the handler did not ask for: skipped when the MTA can skip them; when it cannot
 * (no skip or no-reply bits offered), each still gets CONTINUE without the handler.
 */
static void test_unwanted_steps(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(CONNECT) | STEP(HELO) | STEP(RCPT);
	th->want.replies = STEP(CONNECT) | STEP(RCPT);
	th->verdict[MILTER_STEP_HELO] = MILTER_REJECT;

	/* An MTA that can neither skip nor silence a step: everything is answered. */
	int fd = mta_open(f);
	struct optneg o = mta_optneg(fd, 6, PF_ACTS, MILTER_P_HDR_LEADSPC);
	assert_int_equal(o.protocol, 0);
	struct wire w = { 0 };
	wire_connect(&w, "client.example", '4', 25, "192.0.2.7");
	wire_str(&w, 'H', "helo.example");
	wire_str(&w, 'M', "<a@example.org>");
	wire_str(&w, 'R', "<b@example.net>");
	wire_add(&w, 'T', NULL, 0);
	wire_header(&w, "Subject", "hi");
	wire_add(&w, 'N', NULL, 0);
	wire_add(&w, 'B', LIT("body\r\n"));
	wire_str(&w, 'U', "HELP");
	wire_add(&w, 'E', NULL, 0);
	wire_send(fd, &w);
	static const char replies[] = "crcccccccc"; /* HELO's verdict: NR_HELO was not offered */
	for (size_t i = 0; i < sizeof(replies) - 1; i++)
		expect_reply(fd, (uint8_t)replies[i]);
	expect_silence(fd, 100);
	expect_log(th, "connect(client.example,4,25,192.0.2.7,helo=);helo(helo.example);"
		       "rcpt(<b@example.net> #1);eom(6);");
	mta_close(f, fd);
	WAIT_FOR(atomic_load(&th->closes) == 1);
	expect_log(th, "close;");

	/* Postfix: MAIL, DATA, HEADER, EOH, BODY, UNKNOWN skipped; HELO without reply. */
	fd = mta_open(f);
	o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	assert_int_equal(o.protocol, MILTER_P_NOMAIL | MILTER_P_NODATA | MILTER_P_NOHDRS |
					     MILTER_P_NOEOH | MILTER_P_NOBODY | MILTER_P_NOUNKNOWN |
					     MILTER_P_NR_HELO);
	wire_connect(&w, "client.example", '4', 25, "192.0.2.7");
	wire_send(fd, &w);
	expect_reply(fd, 'c');
	mta_str(fd, 'H', "helo.example");
	expect_silence(fd, 100);
	mta_str(fd, 'R', "<b@example.net>");
	expect_reply(fd, 'c');
	mta_cmd(fd, 'E', NULL, 0);
	expect_reply(fd, 'c');
	expect_silence(fd, 100);
	expect_log(th, "connect(client.example,4,25,192.0.2.7,helo=);helo(helo.example);"
		       "rcpt(<b@example.net> #1);eom(0);");
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
}

/* Observe-only steps get no reply, whatever the verdict; the others exactly one. */
static void test_reply_discipline(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	want_all(th, STEP(CONNECT) | STEP(MAIL) | STEP(RCPT));
	for (int s = 0; s < MILTER_STEP_COUNT; s++)
		th->verdict[s] = MILTER_REJECT; /* never sent where no reply is due */
	th->verdict[MILTER_STEP_CONNECT] = MILTER_CONTINUE;
	th->verdict[MILTER_STEP_MAIL] = MILTER_TEMPFAIL;
	th->verdict[MILTER_STEP_RCPT] = MILTER_REPLY;
	th->reply[MILTER_STEP_RCPT] = "550 5.1.1 No such user\n550 5.1.1 here, 100% sure";
	th->verdict[MILTER_STEP_EOM] = MILTER_DISCARD;
	int fd = mta_open(f);
	struct optneg o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	assert_int_equal(o.protocol, MILTER_P_NR_HELO | MILTER_P_NR_DATA | MILTER_P_NR_HDR |
					     MILTER_P_NR_EOH | MILTER_P_NR_BODY | MILTER_P_NR_UNKN);
	static const struct {
		uint8_t code;
		const char *data;
		size_t len;
		char reply; /* 0: none */
	} seq[] = {
		{ 'D', LIT("Cj\0mx\0"), 0 },
		{ 'C', LIT("client.example\0" "4\0\x19" "192.0.2.7\0"), 'c' },
		{ 'D', LIT("H"), 0 },
		{ 'H', LIT("helo.example\0"), 0 },
		{ 'D', LIT("M"), 0 },
		{ 'M', LIT("<a@example.org>\0SIZE=100\0"), 't' },
		{ 'R', LIT("<b@example.net>\0"), 'y' },
		{ 'T', LIT(""), 0 },
		{ 'L', LIT("Subject\0hi\0"), 0 },
		{ 'L', LIT("X-Empty\0\0"), 0 },
		{ 'N', LIT(""), 0 },
		{ 'B', LIT("body\r\n"), 0 },
		{ 'B', LIT("more\r\n"), 0 },
		{ 'U', LIT("HELP\0"), 0 },
		{ 'D', LIT("E"), 0 },
		{ 'E', LIT(""), 'd' },
		{ 'A', LIT(""), 0 },
		{ 'A', LIT(""), 0 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(seq); i++) {
		mta_cmd(fd, seq[i].code, seq[i].data, seq[i].len);
		if (seq[i].reply == 'y') {
			static const char text[] = "550-5.1.1 No such user\r\n550 5.1.1 here, 100%% sure";
			expect_reply_data(fd, 'y', text, sizeof(text));
		} else if (seq[i].reply) {
			expect_reply(fd, (uint8_t)seq[i].reply);
		}
		expect_silence(fd, 60);
	}
	expect_log(th, "connect(client.example,4,25,192.0.2.7,helo=);helo(helo.example);"
		       "mail(<a@example.org> SIZE=100);rcpt(<b@example.net> #1);data;"
		       "header(Subject=hi);header(X-Empty=);eoh;body(6);body(6);unknown(HELP);eom(12);");
	assert_int_equal(atomic_load(&th->aborts), 0);
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
	WAIT_FOR(atomic_load(&th->closes) == 1);
	expect_log(th, "close;");
}

/* ---- macros ----------------------------------------------------------------------- */

static void test_macros(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	want_all(th, ALL_STEPS);
	th->lookups = "{j} daemon_name {client_addr} i mail_addr rcpt_addr";
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	static const struct {
		uint8_t code;
		const char *data;
		size_t len;
		const char *log; /* after the command's reply, or NULL for MACRO */
	} seq[] = {
		{ 'D', LIT("Cj\0mx.example\0{daemon_name}\0smtpd\0client_addr\0" "192.0.2.7\0"), NULL },
		{ 'C', LIT("client.example\0" "4\0\x19" "192.0.2.7\0"),
		  "connect(client.example,4,25,192.0.2.7,helo=) {j}=mx.example daemon_name=smtpd "
		  "{client_addr}=192.0.2.7 i- mail_addr- rcpt_addr-;" },
		{ 'D', LIT("H"), NULL },
		{ 'H', LIT("helo.example\0"),
		  "helo(helo.example) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 i- "
		  "mail_addr- rcpt_addr-;" },
		{ 'D', LIT("Mi\0Q1\0{mail_addr}\0a@example.org\0"), NULL },
		{ 'M', LIT("<a@example.org>\0"),
		  "mail(<a@example.org>) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 "
		  "i=Q1 mail_addr=a@example.org rcpt_addr-;" },
		{ 'D', LIT("R{rcpt_addr}\0b@example.net\0"), NULL },
		{ 'R', LIT("<b@example.net>\0"),
		  "rcpt(<b@example.net> #1) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 "
		  "i=Q1 mail_addr=a@example.org rcpt_addr=b@example.net;" },
		/* a new MACRO packet for a stage replaces that stage's values */
		{ 'D', LIT("Ri\0Q2\0{rcpt_addr}\0c@example.net\0"), NULL },
		{ 'R', LIT("<c@example.net>\0"),
		  "rcpt(<c@example.net> #2) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 "
		  "i=Q2 mail_addr=a@example.org rcpt_addr=c@example.net;" },
		{ 'D', LIT("T"), NULL },
		{ 'T', LIT(""),
		  "data {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 i=Q2 "
		  "mail_addr=a@example.org rcpt_addr=c@example.net;" },
		/* a new MAIL: M replaced, R and T forgotten */
		{ 'D', LIT("Mi\0Q3\0"), NULL },
		{ 'M', LIT("<d@example.org>\0"),
		  "abort;mail(<d@example.org>) {j}=mx.example daemon_name=smtpd "
		  "{client_addr}=192.0.2.7 i=Q3 mail_addr- rcpt_addr-;" },
		{ 'D', LIT("R{rcpt_addr}\0e@example.net\0"), NULL },
		{ 'R', LIT("<e@example.net>\0"),
		  "rcpt(<e@example.net> #1) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 "
		  "i=Q3 mail_addr- rcpt_addr=e@example.net;" },
		/* HELO forgets every later stage */
		{ 'D', LIT("H"), NULL },
		{ 'H', LIT("again.example\0"),
		  "helo(again.example) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 i- "
		  "mail_addr- rcpt_addr-;" },
		/* an empty value is a value */
		{ 'D', LIT("M{mail_addr}\0\0"), NULL },
		{ 'M', LIT("<>\0"),
		  "abort;mail(<>) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 i- "
		  "mail_addr= rcpt_addr-;" },
		/* an unknown stage is ignored; EOH's macros are forgotten by a RCPT */
		{ 'D', LIT("Zi\0bogus\0"), NULL },
		{ 'D', LIT("Li\0Q4\0rcpt_addr\0hdr\0"), NULL },
		{ 'R', LIT("<f@example.net>\0"),
		  "rcpt(<f@example.net> #1) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 "
		  "i- mail_addr= rcpt_addr-;" },
		/* ABORT forgets M and later, keeps C and H */
		{ 'D', LIT("Ti\0Q5\0"), NULL },
		{ 'A', LIT(""), "abort;" },
		{ 'U', LIT("HELP\0"),
		  "unknown(HELP) {j}=mx.example daemon_name=smtpd {client_addr}=192.0.2.7 i- "
		  "mail_addr- rcpt_addr-;" },
		/* a second CONNECT without QUIT_NC ends the previous SMTP session (close, HELO
		 * forgotten), replaces C and forgets everything later */
		{ 'D', LIT("Cj\0mx2.example\0"), NULL },
		{ 'C', LIT("other.example\0" "6\x02\x4b" "2001:db8::7\0"),
		  "close;connect(other.example,6,587,2001:db8::7,helo=) {j}=mx2.example "
		  "daemon_name- {client_addr}- i- mail_addr- rcpt_addr-;" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(seq); i++) {
		mta_cmd(fd, seq[i].code, seq[i].data, seq[i].len);
		if (seq[i].code != 'D' && seq[i].code != 'A')
			expect_reply(fd, 'c');
		if (seq[i].log)
			expect_log(th, seq[i].log);
	}
	expect_silence(fd, 50);
}

/* ---- connection state ------------------------------------------------------------- */

static void test_abort_keeps_connection(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	want_all(th, ALL_STEPS);
	th->verbose = true;
	th->lookups = "j i";
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	struct wire w = { 0 };
	wire_add(&w, 'D', LIT("Cj\0mx\0"));
	wire_connect(&w, "client.example", '4', 25, "192.0.2.7");
	wire_str(&w, 'H', "helo.example");
	wire_add(&w, 'D', LIT("Mi\0Q1\0"));
	wire_str(&w, 'M', "<a@example.org>");
	wire_str(&w, 'R', "<b@example.net>");
	wire_str(&w, 'R', "<c@example.net>");
	wire_add(&w, 'A', NULL, 0);
	wire_add(&w, 'M', LIT("<d@example.org>\0SIZE=10\0"));
	wire_str(&w, 'R', "<e@example.net>");
	wire_add(&w, 'A', NULL, 0);
	wire_add(&w, 'A', NULL, 0);
	wire_send(fd, &w);
	for (int i = 0; i < 7; i++)
		expect_reply(fd, 'c');
	expect_silence(fd, 100);
	expect_log(th, "connect(client.example,4,25,192.0.2.7,helo=) j=mx i-;"
		       "helo(helo.example) j=mx i-;"
		       "mail(<a@example.org> | client.example 192.0.2.7 helo.example) j=mx i=Q1;"
		       "rcpt(<b@example.net> #1) j=mx i=Q1;rcpt(<c@example.net> #2) j=mx i=Q1;abort;"
		       "mail(<d@example.org> SIZE=10 | client.example 192.0.2.7 helo.example) j=mx i-;"
		       "rcpt(<e@example.net> #1) j=mx i-;abort;");
	assert_int_equal(atomic_load(&th->aborts), 2);
	assert_int_equal(atomic_load(&th->closes), 0);
}

/* The typical Postfix sequence (MILTER-PROTOCOL.md §5.4), three messages, then QUIT. */
static void test_several_messages(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(MAIL) | STEP(RCPT) | STEP(HEADER) | STEP(BODY);
	th->want.replies = STEP(MAIL) | STEP(RCPT);
	th->verdict[MILTER_STEP_EOM] = MILTER_ACCEPT;
	int fd = mta_open(f);
	struct optneg o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	assert_int_equal(o.protocol, MILTER_P_NOCONNECT | MILTER_P_NOHELO | MILTER_P_NODATA |
					     MILTER_P_NOEOH | MILTER_P_NOUNKNOWN | MILTER_P_NR_HDR |
					     MILTER_P_NR_BODY);
	struct wire w = { 0 };
	wire_add(&w, 'D', LIT("Cj\0mx\0"));
	wire_add(&w, 'D', LIT("H"));
	wire_send(fd, &w);
	for (int m = 1; m <= 3; m++) {
		char addr[64];
		wire_add(&w, 'D', LIT("M"));
		snprintf(addr, sizeof(addr), "<s%d@example.org>", m);
		wire_str(&w, 'M', addr);
		for (int r = 1; r <= m; r++) {
			wire_add(&w, 'D', LIT("Ri\0Q\0"));
			snprintf(addr, sizeof(addr), "<r%d@example.net>", r);
			wire_str(&w, 'R', addr);
		}
		wire_add(&w, 'D', LIT("T"));
		wire_add(&w, 'D', LIT("L"));
		wire_header(&w, "Subject", m == 2 ? "two" : "x");
		wire_add(&w, 'D', LIT("L"));
		wire_header(&w, "From", "a");
		wire_add(&w, 'D', LIT("B"));
		wire_add(&w, 'B', "0123456789", (size_t)m);
		wire_add(&w, 'D', LIT("E"));
		wire_add(&w, 'E', NULL, 0);
		wire_add(&w, 'A', NULL, 0);
		wire_send(fd, &w);
		for (int k = 0; k < 1 + m; k++)
			expect_reply(fd, 'c');
		expect_reply(fd, 'a');
		expect_silence(fd, 50);
	}
	expect_log(th, "mail(<s1@example.org>);rcpt(<r1@example.net> #1);header(Subject=x);"
		       "header(From=a);body(1);eom(1);"
		       "mail(<s2@example.org>);rcpt(<r1@example.net> #1);rcpt(<r2@example.net> #2);"
		       "header(Subject=two);header(From=a);body(2);eom(2);"
		       "mail(<s3@example.org>);rcpt(<r1@example.net> #1);rcpt(<r2@example.net> #2);"
		       "rcpt(<r3@example.net> #3);header(Subject=x);header(From=a);body(3);eom(3);");
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
	WAIT_FOR(stat_sessions_ended(f) == 1);
	/* messages that reached EOM were not aborted */
	assert_int_equal(atomic_load(&th->aborts), 0);
	assert_int_equal(atomic_load(&th->closes), 1);
	expect_log(th, "close;");
}

/* QUIT_NC ends the SMTP session but keeps the connection and its negotiation. */
static void test_quit_nc(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	want_all(th, ALL_STEPS);
	th->lookups = "j";
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	struct wire w = { 0 };
	wire_add(&w, 'D', LIT("Cj\0one\0"));
	wire_connect(&w, "one.example", '4', 25, "192.0.2.1");
	wire_str(&w, 'H', "helo-one");
	wire_str(&w, 'M', "<a@example.org>");
	wire_str(&w, 'R', "<b@example.net>");
	wire_add(&w, 'K', NULL, 0);
	wire_connect(&w, "two.example", 'L', 0, "/run/smtpd");
	wire_str(&w, 'H', "helo-two");
	wire_str(&w, 'M', "<c@example.org>");
	wire_add(&w, 'E', NULL, 0);
	wire_send(fd, &w);
	for (int i = 0; i < 8; i++)
		expect_reply(fd, 'c');
	expect_silence(fd, 50);
	expect_log(th, "connect(one.example,4,25,192.0.2.1,helo=) j=one;helo(helo-one) j=one;"
		       "mail(<a@example.org>) j=one;rcpt(<b@example.net> #1) j=one;abort;close;"
		       "connect(two.example,L,0,/run/smtpd,helo=) j-;helo(helo-two) j-;"
		       "mail(<c@example.org>) j-;eom(0) j-;");
	/* QUIT with no message open: no abort, one more close */
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
	WAIT_FOR(stat_sessions_ended(f) == 1);
	expect_log(th, "close;");
	assert_int_equal(atomic_load(&th->aborts), 1);
	assert_int_equal(atomic_load(&th->closes), 2);
}

/* EOF without QUIT counts as ABORT + close, exactly once. */
static void test_eof_counts(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	want_all(th, ALL_STEPS);
	static const struct {
		const char *what;
		const char *cmds; /* one letter per command */
		bool quit;
		unsigned aborts, closes;
	} cases[] = {
		{ "EOF in a message", "CHMR", false, 1, 1 },
		{ "EOF after a message", "CHMRE", false, 0, 1 },
		{ "QUIT in a message, then EOF", "CHMR", true, 1, 1 },
		{ "QUIT after a message", "CHMREA", true, 0, 1 },
		{ "QUIT_NC, then EOF", "CHK", false, 0, 1 },
		{ "QUIT_NC in a message, CONNECT, EOF", "CHMKC", false, 1, 2 },
		{ "EOF after HELO", "CH", false, 0, 1 },
		{ "EOF after CONNECT", "C", false, 0, 1 },
		{ "EOF right after OPTNEG", "", false, 0, 0 },
		{ "EOF with commands unread", "CHMR", false, 1, 1 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		atomic_store(&th->aborts, 0);
		atomic_store(&th->closes, 0);
		uint64_t ended = stat_sessions_ended(f);
		int fd = mta_open(f);
		mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
		struct wire w = { 0 };
		size_t replies = 0;
		for (const char *c = cases[i].cmds; *c; c++) {
			switch (*c) {
			case 'C': wire_connect(&w, "h", '4', 25, "192.0.2.9"); break;
			case 'H': wire_str(&w, 'H', "helo"); break;
			case 'M': wire_str(&w, 'M', "<a@example.org>"); break;
			case 'R': wire_str(&w, 'R', "<b@example.org>"); break;
			default: wire_add(&w, (uint8_t)*c, NULL, 0); break;
			}
			replies += *c != 'A' && *c != 'K';
		}
		if (cases[i].quit)
			wire_add(&w, 'Q', NULL, 0);
		wire_send(fd, &w);
		if (strcmp(cases[i].what, "EOF with commands unread") != 0) {
			for (size_t k = 0; k < replies; k++)
				expect_reply(fd, 'c');
			if (cases[i].quit)
				expect_eof(fd);
		}
		mta_close(f, fd);
		WAIT_FOR(stat_sessions_ended(f) == ended + 1);
		usleep(20000);
		if (atomic_load(&th->aborts) != cases[i].aborts ||
		    atomic_load(&th->closes) != cases[i].closes)
			fail_msg("%s: on_abort %u, on_close %u; expected %u, %u", cases[i].what,
				 atomic_load(&th->aborts), atomic_load(&th->closes), cases[i].aborts,
				 cases[i].closes);
		pthread_mutex_lock(&th->lock);
		th->loglen = 0;
		th->log[0] = '\0';
		pthread_mutex_unlock(&th->lock);
	}
}

/*
 * With NOCONNECT agreed (the handler does not want CONNECT) the session never sees a
 * CONNECT; EOF must still end the SMTP session for the handler, as QUIT does (doc/MILTER.md:
 * "the end of the connection, exactly once").  A handler that keeps per-connection state
 * from HELO on and frees it in on_close would leak it otherwise.
 */
static void test_eof_counts_without_connect(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(HELO);
	th->want.replies = STEP(HELO);
	for (int quit = 1; quit >= 0; quit--) {
		atomic_store(&th->closes, 0);
		uint64_t ended = stat_sessions_ended(f);
		int fd = mta_open(f);
		struct optneg o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
		assert_true(o.protocol & MILTER_P_NOCONNECT);
		struct wire w = { 0 };
		wire_add(&w, 'D', LIT("Cj\0mx\0")); /* Postfix sends C macros anyway */
		wire_str(&w, 'H', "helo.example");
		wire_send(fd, &w);
		expect_reply(fd, 'c');
		if (quit) {
			mta_cmd(fd, 'Q', NULL, 0);
			expect_eof(fd);
		}
		mta_close(f, fd);
		WAIT_FOR(stat_sessions_ended(f) == ended + 1);
		if (atomic_load(&th->closes) != 1)
			fail_msg("%s after HELO with NOCONNECT: on_close called %u times, expected 1",
				 quit ? "QUIT" : "EOF", atomic_load(&th->closes));
	}
}

/*
 * With NOMAIL agreed (the handler wants RCPT but not MAIL) a message starts at RCPT: ABORT
 * after it calls on_abort, and EOF in the middle of it calls on_abort and on_close.
 */
static void test_abort_without_mail(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(RCPT);
	th->want.replies = STEP(RCPT);
	int fd = mta_open(f);
	struct optneg o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	assert_true(o.protocol & MILTER_P_NOMAIL);
	assert_true(o.protocol & MILTER_P_NOCONNECT);
	struct wire w = { 0 };
	wire_add(&w, 'D', LIT("M{mail_addr}\0a@example.org\0"));
	wire_str(&w, 'R', "<b@example.net>");
	wire_add(&w, 'A', NULL, 0);
	wire_send(fd, &w);
	expect_reply(fd, 'c');
	expect_silence(fd, 50);
	if (atomic_load(&th->aborts) != 1)
		fail_msg("ABORT after RCPT with NOMAIL: on_abort called %u times, expected 1",
			 atomic_load(&th->aborts));
	/* the recipient count starts again with the next message */
	wire_str(&w, 'R', "<c@example.net>");
	wire_send(fd, &w);
	expect_reply(fd, 'c');
	expect_log(th, "rcpt(<b@example.net> #1);abort;rcpt(<c@example.net> #1);");
	/* EOF in that message: abort, then close */
	uint64_t ended = stat_sessions_ended(f);
	mta_close(f, fd);
	WAIT_FOR(stat_sessions_ended(f) == ended + 1);
	expect_log(th, "abort;close;");
	assert_int_equal(atomic_load(&th->aborts), 2);
	assert_int_equal(atomic_load(&th->closes), 1);
}

/* ---- modifications ---------------------------------------------------------------- */

struct pkt_expect {
	uint8_t code;
	const char *data;
	size_t len;
};

static const struct pkt_expect all_mods[] = {
	{ 'h', LIT("X-Test\0" "1\0") },
	{ 'i', LIT("\0\0\0\0X-First\0top\0") },
	{ 'm', LIT("\0\0\0\x02Subject\0\0") },
	{ '+', LIT("<new@example.org>\0") },
	{ '2', LIT("<par@example.org>\0NOTIFY=NEVER\0") },
	{ '-', LIT("<old@example.org>\0") },
	{ 'e', LIT("<from@example.org>\0RET=HDRS\0") },
	{ 'q', LIT("held for review\0") },
	{ 'p', LIT("") },
	{ 'b', LIT("new body\r\n") },
};

static void test_eom_modifications(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(MAIL) | STEP(RCPT) | STEP(BODY);
	th->want.replies = STEP(MAIL) | STEP(RCPT) | STEP(BODY);
	th->want.actions = MILTER_ACT_ALL & ~MILTER_ACT_SETSYMLIST;
	th->verdict[MILTER_STEP_EOM] = MILTER_ACCEPT;
	th->eom_mods = true;
	th->try_mods = true;

	/* everything offered: all modifications at EOM, in order, before the final reply */
	int fd = mta_open(f);
	struct optneg o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	assert_int_equal(o.actions, 0xff);
	struct wire w = { 0 };
	wire_str(&w, 'M', "<a@example.org>");
	wire_str(&w, 'R', "<old@example.org>");
	wire_add(&w, 'B', LIT("x\r\n"));
	wire_add(&w, 'E', LIT("tail")); /* the body handler runs here too: still no EOM */
	wire_send(fd, &w);
	for (int i = 0; i < 3; i++)
		expect_reply(fd, 'c');
	for (size_t i = 0; i < ARRAY_SIZE(all_mods); i++)
		expect_reply_data(fd, all_mods[i].code, all_mods[i].data, all_mods[i].len);
	expect_reply(fd, 'a');
	expect_silence(fd, 100);
	/* -EPERM (-1) everywhere but at EOM; -EINVAL (-22) for an empty header name */
	expect_log(th, "mail(<a@example.org>) mods=-1,-1,-1,-1,-1,-1,-1,-1,0,-1,-1;"
		       "rcpt(<old@example.org> #1) mods=-1,-1,-1,-1,-1,-1,-1,-1,0,-1,-1;"
		       "body(3) mods=-1,-1,-1,-1,-1,-1,-1,-1,0,-1,-1;"
		       "body(4) mods=-1,-1,-1,-1,-1,-1,-1,-1,0,-1,-1;"
		       "eom(7) mods=0,0,0,0,0,0,0,0,0,0,-22;");
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
	expect_log(th, "close;");
	mta_close(f, fd);

	/* an MTA offering the version 1 actions only: the others are refused */
	fd = mta_open(f);
	o = mta_optneg(fd, 6, 0x0f, PF_PROTO);
	assert_int_equal(o.actions, 0x0f);
	mta_cmd(fd, 'E', NULL, 0);
	expect_reply_data(fd, 'h', all_mods[0].data, all_mods[0].len);
	expect_reply_data(fd, 'i', all_mods[1].data, all_mods[1].len);
	expect_reply_data(fd, '+', all_mods[3].data, all_mods[3].len);
	expect_reply_data(fd, '-', all_mods[5].data, all_mods[5].len);
	expect_reply(fd, 'p');
	expect_reply_data(fd, 'b', all_mods[9].data, all_mods[9].len);
	expect_reply(fd, 'a');
	expect_silence(fd, 100);
	expect_log(th, "eom(0) mods=0,0,-1,0,-1,0,-1,-1,0,0,-22;");
	mta_close(f, fd);
}

/* A REPLBODY larger than one packet is cut into packets of at most 65535 bytes. */
static void replbody_step(struct th *th, struct milter_session *ms)
{
	(void)th;
	static char body[200000];
	for (size_t i = 0; i < sizeof(body); i++)
		body[i] = "0123456789abcdef\r\n"[i % 18];
	milter_session_replace_body(ms, str_make(body, sizeof(body)));
}

static enum milter_verdict big_body_step(void *ctx, struct milter_session *ms)
{
	replbody_step(ctx, ms);
	return MILTER_ACCEPT;
}

static void test_eom_replbody_packets(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.actions = MILTER_ACT_CHGBODY;
	/* a handler whose EOM step replaces a 200000-byte body */
	struct milter_handler *h = th_handler(th);
	h->on_step[MILTER_STEP_EOM] = big_body_step;
	h->destroy = NULL;
	milter_service_set_handler(f->svc, h);
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	mta_cmd(fd, 'E', NULL, 0);
	struct reply *r = reply_new();
	size_t total = 0, packets = 0;
	for (;;) {
		assert_int_equal(mta_read(fd, 3000, r), 1);
		if (r->code != 'b')
			break;
		assert_true(r->len <= 65535);
		for (size_t i = 0; i < r->len; i++)
			if (r->data[i] != "0123456789abcdef\r\n"[(total + i) % 18])
				fail_msg("body byte %zu differs", total + i);
		total += r->len;
		packets++;
	}
	assert_int_equal(r->code, 'a');
	assert_int_equal(total, 200000);
	assert_int_equal(packets, 4);
	free(r);
	expect_silence(fd, 50);
	mta_close(f, fd);
}

/* ---- deferred verdicts ------------------------------------------------------------ */

static void test_pending_resume(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(HELO) | STEP(MAIL) | STEP(RCPT);
	th->want.replies = STEP(MAIL) | STEP(RCPT);
	th->want.actions = MILTER_ACT_ADDHDRS | MILTER_ACT_QUARANTINE;
	th->pending_ms[MILTER_STEP_MAIL] = 300;
	th->verdict[MILTER_STEP_MAIL] = MILTER_REJECT;
	th->progress_before_resume = true;
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);

	/* MAIL deferred; RCPT pipelined behind it is not read until the verdict */
	uint64_t t0 = now_ms_test();
	struct wire w = { 0 };
	wire_add(&w, 'D', LIT("M"));
	wire_str(&w, 'M', "<a@example.org>");
	wire_add(&w, 'D', LIT("R"));
	wire_str(&w, 'R', "<b@example.net>");
	wire_send(fd, &w);
	expect_silence(fd, 150);
	assert_int_equal(atomic_load(&th->steps[MILTER_STEP_MAIL]), 1);
	assert_int_equal(atomic_load(&th->steps[MILTER_STEP_RCPT]), 0);
	expect_reply(fd, 'p');
	expect_reply(fd, 'r');
	assert_true(now_ms_test() - t0 >= 250);
	expect_reply(fd, 'c');
	expect_silence(fd, 50);
	expect_log(th, "mail(<a@example.org>) pending;resume(reject);rcpt(<b@example.net> #1);resumed;");

	/* a deferred step without reply (HELO): no answer for it, the next one follows */
	th->pending_ms[MILTER_STEP_HELO] = 100;
	th->verdict[MILTER_STEP_HELO] = MILTER_TEMPFAIL;
	th->pending_ms[MILTER_STEP_MAIL] = 0;
	th->verdict[MILTER_STEP_MAIL] = MILTER_CONTINUE;
	wire_str(&w, 'H', "helo.example");
	wire_str(&w, 'M', "<c@example.org>");
	wire_send(fd, &w);
	expect_silence(fd, 50);
	assert_int_equal(atomic_load(&th->steps[MILTER_STEP_MAIL]), 1);
	/* no 'p' either: progress is refused (-EPERM) at a step the MTA expects no answer to */
	expect_reply(fd, 'c');
	expect_silence(fd, 50);
	expect_log(th, "helo(helo.example) pending;resume(tempfail);abort;mail(<c@example.org>);resumed;");

	/* a deferred EOM: modifications made before deferring go first, then the verdict */
	th->pending_ms[MILTER_STEP_EOM] = 100;
	th->verdict[MILTER_STEP_EOM] = MILTER_ACCEPT;
	th->progress_before_resume = false;
	th->eom_mods = true;
	mta_cmd(fd, 'E', NULL, 0);
	expect_reply_data(fd, 'h', all_mods[0].data, all_mods[0].len);
	expect_reply_data(fd, 'i', all_mods[1].data, all_mods[1].len);
	expect_reply_data(fd, 'q', all_mods[7].data, all_mods[7].len);
	expect_reply(fd, 'p');
	expect_reply(fd, 'a');
	expect_silence(fd, 50);
	expect_log(th, "eom(0) mods=0,0,-1,-1,-1,-1,-1,0,0,-1,-22 pending;resume(accept);resumed;");
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
	expect_log(th, "close;");

	/* a protocol error read after the verdict ends the session inside
	 * milter_session_resume(): on_abort and on_close run before it returns */
	th->eom_mods = false;
	th->pending_ms[MILTER_STEP_MAIL] = 100;
	fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	wire_str(&w, 'M', "<d@example.org>");
	wire_raw(&w, "\0\0\0\0", 4);
	wire_send(fd, &w);
	WAIT_FOR(stat_protocol_errors(f) == 1);
	expect_log(th, "mail(<d@example.org>) pending;resume(continue);abort;close;resumed;");
}

/* A tarpit: milter_session_delay() holds the step's reply on the session's own timer. */
static void test_delay_reply(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(HELO) | STEP(MAIL) | STEP(RCPT) | STEP(EOM);
	th->want.replies = STEP(MAIL) | STEP(RCPT) | STEP(EOM);
	th->delay_ms[MILTER_STEP_RCPT] = 300;
	th->delay_ms[MILTER_STEP_HELO] = 1000; /* no reply awaited: ignored */
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);

	/* HELO has no reply and is not held: MAIL is answered at once */
	uint64_t t0 = now_ms_test();
	struct wire w = { 0 };
	wire_str(&w, 'H', "helo.example");
	wire_str(&w, 'M', "<a@example.org>");
	wire_send(fd, &w);
	expect_reply(fd, 'c');
	assert_true(now_ms_test() - t0 < 250);
	expect_log(th, "helo(helo.example) delay;mail(<a@example.org>);");

	/* RCPT held 300 ms; the RCPT pipelined behind it is read only after the reply */
	t0 = now_ms_test();
	wire_str(&w, 'R', "<b@example.net>");
	wire_str(&w, 'R', "<c@example.net>");
	wire_send(fd, &w);
	expect_silence(fd, 150);
	assert_int_equal(atomic_load(&th->steps[MILTER_STEP_RCPT]), 1);

	/* meanwhile another session on the same (single) worker is answered at once: the
	 * delay holds no thread */
	int fd2 = mta_open(f);
	mta_optneg(fd2, 6, PF_ACTS, PF_PROTO);
	mta_str(fd2, 'M', "<other@example.org>");
	expect_reply(fd2, 'c');
	uint64_t other = now_ms_test() - t0;

	expect_reply(fd, 'c');
	uint64_t first = now_ms_test() - t0;
	assert_true(first >= 295);
	assert_true(other + 20 < first); /* served while the first reply was held */
	expect_reply(fd, 'c');
	assert_true(now_ms_test() - t0 >= first + 295);
	expect_silence(fd, 50);
	expect_log(th, "rcpt(<b@example.net> #1) delay;mail(<other@example.org>);"
		       "rcpt(<c@example.net> #2) delay;");

	/* a pending step's verdict is delayed after the handler's own wait, and its
	 * verdict is the one sent (accept at EOM) */
	th->delay_ms[MILTER_STEP_RCPT] = 0;
	th->pending_ms[MILTER_STEP_EOM] = 100;
	th->delay_ms[MILTER_STEP_EOM] = 200;
	th->verdict[MILTER_STEP_EOM] = MILTER_ACCEPT;
	t0 = now_ms_test();
	mta_cmd(fd, 'E', NULL, 0);
	expect_silence(fd, 200);
	expect_reply(fd, 'a');
	assert_true(now_ms_test() - t0 >= 295);
	expect_log(th, "eom(0) delay pending;resume(accept);resumed;");

	/* the MTA hangs up while its reply is held: the session ends (the engine keeps a
	 * paused session that reads EOF until it resumes, so at the latest when the delay
	 * is over), and the timer never touches a freed session (ASan/UBSan would say) */
	th->pending_ms[MILTER_STEP_EOM] = 0;
	th->delay_ms[MILTER_STEP_RCPT] = 1000;
	uint64_t ended = stat_sessions_ended(f);
	mta_str(fd, 'M', "<d@example.org>");
	expect_reply(fd, 'c');
	mta_str(fd, 'R', "<e@example.net>");
	expect_silence(fd, 100);
	mta_close(f, fd);
	WAIT_FOR(stat_sessions_ended(f) == ended + 1);
	expect_log(th, "mail(<d@example.org>);rcpt(<e@example.net> #1) delay;abort;close;");

	/* and a session still held when the engine stops is freed by the teardown */
	mta_str(fd2, 'R', "<f@example.net>");
	expect_silence(fd2, 100);
	expect_log(th, "rcpt(<f@example.net> #1) delay;");
}

/* ---- body ------------------------------------------------------------------------- */

static void test_skip_body(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(BODY);
	th->want.replies = STEP(BODY);
	th->want.skip = true;
	th->verdict[MILTER_STEP_BODY] = MILTER_SKIP;
	int fd = mta_open(f);
	struct optneg o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	assert_true(o.protocol & MILTER_P_SKIP);
	for (int m = 0; m < 2; m++) {
		mta_cmd(fd, 'B', LIT("chunk one\r\n"));
		expect_reply(fd, 's');
		mta_cmd(fd, 'B', LIT("chunk two\r\n")); /* an MTA that sends one more anyway */
		expect_reply(fd, 'c');
		mta_cmd(fd, 'E', LIT("data"));
		expect_reply(fd, 'c');
		mta_cmd(fd, 'A', NULL, 0);
		expect_silence(fd, 50);
	}
	/* the handler saw the first chunk of each message only, and each EOM */
	expect_log(th, "body(11);eom(26);body(11);eom(26);");
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
	expect_log(th, "close;");
	mta_close(f, fd);

	/* SKIP not offered: the verdict becomes CONTINUE and every chunk is shown */
	fd = mta_open(f);
	o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO & ~MILTER_P_SKIP);
	assert_false(o.protocol & MILTER_P_SKIP);
	mta_cmd(fd, 'B', LIT("chunk one\r\n"));
	expect_reply(fd, 'c');
	mta_cmd(fd, 'B', LIT("chunk two\r\n"));
	expect_reply(fd, 'c');
	expect_log(th, "body(11);body(11);");
	mta_close(f, fd);
}

static void test_bodyeob_data(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(BODY);
	th->want.replies = STEP(BODY);
	th->verdict[MILTER_STEP_EOM] = MILTER_ACCEPT;
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	mta_cmd(fd, 'B', LIT("0123456789"));
	expect_reply(fd, 'c');
	mta_cmd(fd, 'E', LIT("tail\r\n"));
	expect_reply(fd, 'a');
	expect_silence(fd, 100);
	expect_log(th, "body(10);body(6);eom(16);");
}

/*
 * Data carried by BODYEOB goes to the body handler; a decisive verdict there (not CONTINUE
 * or SKIP) is the answer to end of message and the EOM handler is not called, as libmilter
 * does -- also when that verdict is deferred.
 */
static void test_bodyeob_data_verdict(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(BODY);
	th->want.replies = STEP(BODY);
	th->want.actions = MILTER_ACT_ADDHDRS;
	th->verdict[MILTER_STEP_BODY] = MILTER_REJECT;
	th->verdict[MILTER_STEP_EOM] = MILTER_ACCEPT;
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	mta_cmd(fd, 'E', LIT("virus signature"));
	expect_reply(fd, 'r');
	expect_silence(fd, 50);
	expect_log(th, "body(15);");
	/* CONTINUE for the data: EOM decides */
	th->verdict[MILTER_STEP_BODY] = MILTER_CONTINUE;
	mta_cmd(fd, 'E', LIT("clean"));
	expect_reply(fd, 'a');
	expect_log(th, "body(5);eom(5);");
	/* deferred: nothing until the verdict, then exactly one reply; modifications made
	 * while it is pending belong to end of message */
	th->verdict[MILTER_STEP_BODY] = MILTER_TEMPFAIL;
	th->pending_ms[MILTER_STEP_BODY] = 100;
	struct wire w = { 0 };
	wire_add(&w, 'E', LIT("later"));
	wire_str(&w, 'U', "NOOP"); /* not read before the verdict; no reply (not wanted) */
	wire_send(fd, &w);
	expect_silence(fd, 50);
	expect_reply(fd, 't');
	expect_silence(fd, 50);
	expect_log(th, "body(5) pending;resume(tempfail);resumed;");
	mta_cmd(fd, 'Q', NULL, 0);
	expect_eof(fd);
}

/* ---- protocol errors -------------------------------------------------------------- */

static void test_protocol_errors(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	want_all(th, ALL_STEPS);
	/* a healthy session that must survive the others' errors */
	int good = mta_open(f);
	mta_optneg(good, 6, PF_ACTS, PF_PROTO);
	mta_str(good, 'H', "first");
	expect_reply(good, 'c');

	static const struct {
		const char *bytes;
		size_t len;
		bool negotiate;
		const char *why;
	} cases[] = {
		{ LIT("\0\0\0\0"), true, "packet length 0" },
		{ LIT("\0\0\0\x01Z"), true, "unknown command" },
		{ LIT("\0\0\0\x05Hhelo"), true, "HELO without NUL" },
		{ LIT("\x7f\xff\xff\xff"), true, "packet length above limit" },
		{ LIT("\0\0\0\x06Hhelo\0"), false, "command before option negotiation" },
		{ LIT("\0\0\0\x0dO\0\0\0\x06\0\0\x01\xff\0\x1f\xff\xff"), true, "second option negotiation" },
		{ LIT("\0\0\0\x05O\0\0\0\x06"), false, "OPTNEG shorter than 12 bytes" },
		{ LIT("\0\0\0\x01" "c"), true, "unknown command" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		uint64_t before = stat_protocol_errors(f);
		int fd = mta_open(f);
		if (cases[i].negotiate)
			mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
		struct wire w = { 0 };
		wire_raw(&w, cases[i].bytes, cases[i].len);
		wire_str(&w, 'H', "never seen");
		wire_send(fd, &w);
		expect_eof(fd);
		WAIT_FOR(stat_protocol_errors(f) == before + 1);
		if (!logcap_contains(cases[i].why))
			fail_msg("case %zu: no log line with \"%s\"", i, cases[i].why);
		mta_close(f, fd);
		/* the other session goes on */
		mta_str(good, 'H', "still here");
		expect_reply(good, 'c');
	}
	/* a new connection works too */
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	mta_str(fd, 'H', "new");
	expect_reply(fd, 'c');
	assert_int_equal(stat_protocol_errors(f), ARRAY_SIZE(cases));
	assert_int_equal(atomic_load(&th->steps[MILTER_STEP_HELO]), 2 + ARRAY_SIZE(cases));
}

/* BODY chunks above the negotiated data size are protocol errors; headers are not capped
 * at 64K (Postfix sends a whole header in one packet). */
static void test_body_size_limit(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	th->want.steps = STEP(BODY) | STEP(HEADER);
	th->want.replies = STEP(BODY) | STEP(HEADER);
	char *big = malloc(MILTER_DATA_256K + 2);
	assert_non_null(big);
	memset(big, 'b', MILTER_DATA_256K + 2);
	static const struct {
		uint32_t proto;
		uint8_t code;
		size_t len;
		bool ok;
	} cases[] = {
		{ PF_PROTO, 'B', 65535, true },
		{ PF_PROTO, 'B', 65536, false },
		{ PF_PROTO, 'E', 65536, false },
		{ PF_PROTO | MILTER_P_MDS_256K, 'B', 65536, true },
		{ PF_PROTO | MILTER_P_MDS_256K, 'B', MILTER_DATA_256K, true },
		{ PF_PROTO | MILTER_P_MDS_256K, 'B', MILTER_DATA_256K + 1, false },
		{ PF_PROTO | MILTER_P_MDS_1M, 'B', MILTER_DATA_256K + 1, true },
	};
	uint64_t errors = 0;
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		int fd = mta_open(f);
		mta_optneg(fd, 6, PF_ACTS, cases[i].proto);
		mta_cmd(fd, cases[i].code, big, cases[i].len);
		if (cases[i].ok) {
			expect_reply(fd, 'c');
		} else {
			expect_eof(fd);
			errors++;
			WAIT_FOR(stat_protocol_errors(f) == errors);
		}
		mta_close(f, fd);
	}
	/* a 100000-byte header, without MDS */
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	big[7] = '\0';
	big[100000] = '\0';
	mta_cmd(fd, 'L', big, 100001);
	expect_reply(fd, 'c');
	free(big);
	assert_true(logcap_contains("BODY chunk larger than the negotiated data size"));
	assert_int_equal(stat_protocol_errors(f), errors);
}

/* Verdicts a step cannot take are made legal; per-session limits and a new conf. */
static void test_verdict_edge_cases(void **state)
{
	struct fixture *f = *state;
	struct th *th = f->th;
	want_all(th, ALL_STEPS);
	th->verdict[MILTER_STEP_CONNECT] = MILTER_DISCARD;	  /* passed on, as is */
	th->verdict[MILTER_STEP_HELO] = MILTER_REPLY;		  /* without text */
	th->verdict[MILTER_STEP_MAIL] = (enum milter_verdict)42;  /* out of range */
	th->verdict[MILTER_STEP_RCPT] = MILTER_SKIP;		  /* not at BODY */
	th->verdict[MILTER_STEP_DATA] = MILTER_REPLY;
	th->reply[MILTER_STEP_DATA] = "250 2.0.0 not a failure"; /* refused: no text */
	th->verdict[MILTER_STEP_EOH] = MILTER_REPLY;
	th->reply[MILTER_STEP_EOH] = "421 4.3.2 Shutting down";
	int fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	struct wire w = { 0 };
	wire_connect(&w, "h", '4', 25, "192.0.2.9");
	wire_str(&w, 'H', "helo");
	wire_str(&w, 'M', "<a@example.org>");
	wire_str(&w, 'R', "<b@example.net>");
	wire_add(&w, 'T', NULL, 0);
	wire_add(&w, 'N', NULL, 0);
	wire_send(fd, &w);
	expect_reply(fd, 'd');
	expect_reply(fd, 't');
	expect_reply(fd, 't');
	expect_reply(fd, 'c');
	expect_reply(fd, 't');
	expect_reply_data(fd, 'y', LIT("421 4.3.2 Shutting down\0"));
	expect_silence(fd, 50);
	expect_log(th, "connect(h,4,25,192.0.2.9,helo=);helo(helo);mail(<a@example.org>);"
		       "rcpt(<b@example.net> #1);data bad-reply;eoh;");
	WAIT_FOR(logcap_contains("reply verdict without text at helo; answering tempfail"));
	mta_close(f, fd);

	/* arguments above the session's caps close that session */
	char big[5000];
	memset(big, 'h', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	static const struct {
		uint8_t code;
		const char *why;
	} caps[] = {
		{ 'H', "HELO argument too long" },
		{ 'M', "sender address too long" },
		{ 'R', "recipient address too long" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(caps); i++) {
		fd = mta_open(f);
		mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
		mta_str(fd, caps[i].code, big);
		expect_eof(fd);
		WAIT_FOR(logcap_contains(caps[i].why));
		mta_close(f, fd);
	}

	/* a new conf applies to sessions that start from now on */
	int old = mta_open(f);
	mta_optneg(old, 6, PF_ACTS, PF_PROTO);
	struct milter_service_conf conf = { .max_packet = 1000, .max_macros = 64 };
	milter_service_set_conf(f->svc, &conf);
	mta_cmd(old, 'B', big, 2000);
	expect_reply(old, 'c'); /* 2000 bytes: the session keeps the cap it started with */
	fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	mta_cmd(fd, 'D', LIT("Cj\0short\0"));
	mta_str(fd, 'H', "fits");
	expect_reply(fd, 't'); /* HELO's verdict above */
	mta_cmd(fd, 'D', LIT("C{daemon_name}\0a macro packet above 64 bytes of names and values\0"));
	expect_eof(fd);
	WAIT_FOR(logcap_contains("macros larger than the limit"));
	mta_close(f, fd);
	fd = mta_open(f);
	mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	mta_cmd(fd, 'B', big, 1000);
	expect_eof(fd);
	WAIT_FOR(logcap_contains("packet length above limit"));
}

/* ---- the static handler ------------------------------------------------------------ */

static void test_static_handler(void **state)
{
	struct fixture *f = *state;
	struct milter_static_conf c = { 0 };
	const char *why = NULL;
	c.set[MILTER_STEP_HELO] = true;
	assert_int_equal(milter_static_parse_action("continue", MILTER_STEP_HELO,
						    &c.verdict[MILTER_STEP_HELO],
						    &c.reply[MILTER_STEP_HELO], &why), 0);
	c.set[MILTER_STEP_RCPT] = true;
	assert_int_equal(milter_static_parse_action("550 5.7.1 No relay, 100% sure", MILTER_STEP_RCPT,
						    &c.verdict[MILTER_STEP_RCPT],
						    &c.reply[MILTER_STEP_RCPT], &why), 0);
	c.add_header = calloc(3, sizeof(char *));
	assert_non_null(c.add_header);
	c.add_header[0] = strdup("X-Sluice: tested");
	c.add_header[1] = strdup("X-Empty:");
	c.quarantine = strdup("static");
	milter_service_set_handler(f->svc, milter_static_new(&c));
	for (int i = 0; i < MILTER_STEP_COUNT; i++)
		assert_false(c.set[i]); /* taken over */
	int fd = mta_open(f);
	struct optneg o = mta_optneg(fd, 6, PF_ACTS, PF_PROTO);
	assert_int_equal(o.actions, MILTER_ACT_ADDHDRS | MILTER_ACT_QUARANTINE);
	assert_int_equal(o.protocol, 0x37f & ~(MILTER_P_NOHELO | MILTER_P_NORCPT));
	mta_str(fd, 'H', "helo.example");
	expect_reply(fd, 'c');
	mta_str(fd, 'R', "<b@example.net>");
	static const char text[] = "550 5.7.1 No relay, 100%% sure";
	expect_reply_data(fd, 'y', text, sizeof(text));
	mta_cmd(fd, 'E', NULL, 0);
	expect_reply_data(fd, 'h', LIT("X-Sluice\0tested\0"));
	expect_reply_data(fd, 'h', LIT("X-Empty\0\0"));
	expect_reply_data(fd, 'q', LIT("static\0"));
	expect_reply(fd, 'a');
	expect_silence(fd, 50);
}

static void test_static_parse(void **state)
{
	(void)state;
	static const struct {
		const char *text;
		enum milter_step step;
		int r;
		enum milter_verdict v;
	} actions[] = {
		{ "continue", MILTER_STEP_CONNECT, 0, MILTER_CONTINUE },
		{ "ACCEPT", MILTER_STEP_HELO, 0, MILTER_ACCEPT },
		{ "Reject", MILTER_STEP_RCPT, 0, MILTER_REJECT },
		{ "tempfail", MILTER_STEP_EOM, 0, MILTER_TEMPFAIL },
		{ "discard", MILTER_STEP_MAIL, 0, MILTER_DISCARD },
		{ "discard", MILTER_STEP_CONNECT, -EINVAL, 0 },
		{ "discard", MILTER_STEP_HELO, -EINVAL, 0 },
		{ "skip", MILTER_STEP_BODY, 0, MILTER_SKIP },
		{ "skip", MILTER_STEP_RCPT, -EINVAL, 0 },
		{ "451 4.7.1 Later", MILTER_STEP_RCPT, 0, MILTER_REPLY },
		{ "550-5.7.1 a\n550 5.7.1 b", MILTER_STEP_EOM, 0, MILTER_REPLY },
		{ "250 2.0.0 Ok", MILTER_STEP_RCPT, -EINVAL, 0 },
		{ "550 4.7.1 mismatch", MILTER_STEP_RCPT, -EINVAL, 0 },
		{ "550", MILTER_STEP_RCPT, -EINVAL, 0 },
		{ "bogus", MILTER_STEP_RCPT, -EINVAL, 0 },
		{ "", MILTER_STEP_RCPT, -EINVAL, 0 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(actions); i++) {
		enum milter_verdict v = (enum milter_verdict)99;
		char *reply = (char *)"untouched";
		const char *why = NULL;
		int r = milter_static_parse_action(actions[i].text, actions[i].step, &v, &reply, &why);
		if (r != actions[i].r)
			fail_msg("action %zu \"%s\": %d (%s)", i, actions[i].text, r, why ? why : "");
		if (r == 0) {
			assert_int_equal(v, actions[i].v);
			if (v == MILTER_REPLY)
				assert_string_equal(reply, actions[i].text);
			else
				assert_null(reply);
			if (v == MILTER_REPLY)
				free(reply);
		} else {
			assert_non_null(why);
		}
	}
	static const struct {
		const char *text;
		bool indexed;
		int r;
	} headers[] = {
		{ "X-Spam: yes", false, 0 },
		{ "X-Empty:", false, 0 },
		{ "X-NoSpace:value", false, 0 },
		{ "1 X-Spam: yes", true, 0 },
		{ "0 Subject:", true, 0 },
		{ ": value", false, -EINVAL },
		{ "No colon", false, -EINVAL },
		{ "Bad name: v", false, -EINVAL },
		{ "Bad\tname: v", false, -EINVAL },
		{ "X-Spam: yes", true, -EINVAL },
		{ "1X: y", true, -EINVAL },
		{ "4294967296 X: y", true, -EINVAL },
		{ "4294967295 X: y", true, 0 },
		{ "", false, -EINVAL },
	};
	for (size_t i = 0; i < ARRAY_SIZE(headers); i++) {
		const char *why = NULL;
		int r = milter_static_check_header(headers[i].text, headers[i].indexed, &why);
		if (r != headers[i].r)
			fail_msg("header %zu \"%s\": %d", i, headers[i].text, r);
	}
	assert_string_equal(milter_verdict_name(MILTER_PENDING), "pending");
	assert_string_equal(milter_verdict_name((enum milter_verdict)42), "?");
}

int main(void)
{
	/* as the daemon does: a peer that hangs up is seen as EPIPE, not a signal */
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_negotiated_reply, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unwanted_steps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reply_discipline, setup, teardown),
		cmocka_unit_test_setup_teardown(test_macros, setup, teardown),
		cmocka_unit_test_setup_teardown(test_abort_keeps_connection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_several_messages, setup, teardown),
		cmocka_unit_test_setup_teardown(test_quit_nc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eof_counts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eof_counts_without_connect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_abort_without_mail, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eom_modifications, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eom_replbody_packets, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pending_resume, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delay_reply, setup, teardown),
		cmocka_unit_test_setup_teardown(test_skip_body, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bodyeob_data, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bodyeob_data_verdict, setup, teardown),
		cmocka_unit_test_setup_teardown(test_protocol_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_body_size_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_verdict_edge_cases, setup, teardown),
		cmocka_unit_test_setup_teardown(test_static_handler, setup, teardown),
		cmocka_unit_test(test_static_parse),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
