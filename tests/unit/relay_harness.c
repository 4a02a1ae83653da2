/*
 * relay_harness -- see relay_harness.h.  The second half is the scripted peer: the
 * functions of smtp_out.h the relay's rooms call, doing what the test says.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>
#include <event2/event.h>

#include "fixture.h"
#include "queue_dir.h"
#include "relay_harness.h"
#include "util.h"

static struct harness *current; /* the clock's and the peer's */

static uint64_t harness_clock(void)
{
	return current->now;
}

static void on_log(void *arg, enum log_level level, const char *line)
{
	struct harness *h = arg;
	(void)level;
	if (h->nlog < HARNESS_LOG_MAX)
		h->log[h->nlog++] = strdup(line);
	if (getenv("HARNESS_LOG"))
		fprintf(stderr, "relay: %s\n", line);
}

static char *xstrdup(const char *s)
{
	char *d = strdup(s);
	assert_non_null(d);
	return d;
}

static void route_defaults(struct route_conf *rc, const char *name, const char *domain)
{
	*rc = (struct route_conf){ 0 };
	rc->name = xstrdup(name);
	rc->domains = calloc(2, sizeof(*rc->domains));
	assert_non_null(rc->domains);
	rc->domains[0] = xstrdup(domain);
	rc->ndomains = 1;
	rc->host = xstrdup("127.0.0.1");
	rc->port = 2525;
	rc->connections = 1;
	rc->recipients_per_message = 100;
	rc->guard_ms = 0;
}

void harness_init(struct harness *h)
{
	memset(h, 0, sizeof(*h));
	assert_int_equal(fixture_dir_make(h->dir, sizeof(h->dir), "test_relay"), 0);
	relay_conf_init(&h->conf);
	free(h->conf.hostname);
	h->conf.hostname = xstrdup("relay.test");
	free(h->conf.state_dir);
	h->conf.state_dir = xstrdup(h->dir);
	h->conf.routes = calloc(4, sizeof(*h->conf.routes));
	assert_non_null(h->conf.routes);
	route_defaults(&h->conf.routes[0], "r", "*");
	h->conf.nroutes = 1;
	h->auto_ready = true;
	h->now = realtime_ns() / 1000 * 1000; /* whole microseconds, as sends are counted */
}

struct route_conf *harness_route(struct harness *h, const char *name, const char *domain)
{
	assert_true(h->conf.nroutes < 4);
	/* before the catch-all: the first route that matches takes the domain */
	struct route_conf *rc = &h->conf.routes[h->conf.nroutes];
	*rc = h->conf.routes[h->conf.nroutes - 1];
	route_defaults(&h->conf.routes[h->conf.nroutes - 1], name, domain);
	h->conf.nroutes++;
	return &h->conf.routes[h->conf.nroutes - 2];
}

/* The queue, then the relay over it, on h->dir; started and loaded. */
static void start(struct harness *h)
{
	current = h;
	char qdir[128], err[256];
	snprintf(qdir, sizeof(qdir), "%s/queue", h->dir);
	struct queue_conf qc = { .dir = qdir, .commit_batch = 8 };
	if (queue_open(&qc, NULL, NULL, &h->q, err, sizeof(err)) < 0)
		fail_msg("queue_open: %s", err);
	h->r = relay_new(&h->conf, h->q, NULL, NULL, on_log, h, err, sizeof(err));
	if (!h->r)
		fail_msg("relay_new: %s", err);
	h->r->clock = harness_clock;
	assert_int_equal(queue_start(h->q), 0);
	assert_int_equal(queue_wait_loaded(h->q), 0);
	harness_run(h);
}

static void stop(struct harness *h)
{
	queue_drain(h->q);
	h->r = relay_free(h->r);
	h->q = queue_free(h->q);
}

void harness_open(struct harness *h)
{
	char qdir[128];
	snprintf(qdir, sizeof(qdir), "%s/queue", h->dir);
	assert_int_equal(mkdir(qdir, 0700), 0);
	start(h);
}

void harness_restart(struct harness *h)
{
	stop(h);
	start(h);
}

void harness_close(struct harness *h)
{
	stop(h);
	relay_conf_clear(&h->conf);
	for (size_t i = 0; i < h->nlog; i++)
		free(h->log[i]);
	fixture_dir_remove(h->dir);
	current = NULL;
}

void harness_run(struct harness *h)
{
	/* the committer's posts come through the mailbox's eventfd: a few passes let every
	 * chain of callbacks (one event arming the next at once) run out */
	for (int i = 0; i < 8; i++)
		event_base_loop(h->r->base, EVLOOP_NONBLOCK);
}

void harness_put(struct harness *h, const char *sender, const char *const *rcpts, size_t n,
		 char id[QUEUE_ID_LEN + 1])
{
	harness_put_dsn(h, sender, rcpts, NULL, n, id);
}

void harness_put_dsn(struct harness *h, const char *sender, const char *const *rcpts,
		     const unsigned *notify, size_t n, char id[QUEUE_ID_LEN + 1])
{
	struct queue_envelope env = { .sender = str_cstr(sender), .client = str_cstr("[127.0.0.1]"),
				      .helo = str_cstr("client.test") };
	env.rcpt_dsn = notify != NULL; /* a file that keeps NOTIFY (version 2) */
	struct queue_new *qn = NULL;
	assert_int_equal(queue_new_begin(h->q, &env, &qn), 0);
	memcpy(id, queue_new_id(qn), QUEUE_ID_LEN + 1);
	for (size_t i = 0; i < n; i++) {
		if (notify)
			assert_int_equal(queue_new_rcpt_dsn(qn, str_cstr(rcpts[i]), notify[i],
							    str_cstr("")), 0);
		else
			assert_int_equal(queue_new_rcpt(qn, str_cstr(rcpts[i])), 0);
	}
	assert_int_equal(queue_new_body(qn, str_cstr("Subject: t\r\n\r\nhello\r\n")), 0);
	struct waiter w = WAITER_INIT;
	assert_int_equal(queue_new_commit(qn, (void (*)(void *, int))waiter_done, &w), 0);
	waiter_wait(&w, 1);
	assert_int_equal(w.result, 0);
	/* the queue's listener posts the news to the relay's mailbox */
	for (int i = 0; i < 500 && !msg_find(h->r, id); i++) {
		event_base_loop(h->r->base, EVLOOP_NONBLOCK);
		usleep(2000);
	}
	assert_non_null(msg_find(h->r, id));
	harness_run(h);
}

void harness_advance(struct harness *h, uint64_t ms)
{
	harness_advance_us(h, ms * 1000u);
}

void harness_advance_us(struct harness *h, uint64_t us)
{
	h->now += us * 1000u;
	struct lane *l;
	TAILQ_FOREACH(l, &h->r->lanes, link)
		lane_kick(l);
	harness_run(h);
}

struct smtp_out *harness_busy(struct harness *h)
{
	struct smtp_out *found = NULL;
	for (struct smtp_out *c = h->conns; c; c = c->next)
		if (c->done)
			found = c; /* the list is newest first: the last one is the oldest */
	return found;
}

void harness_ready(struct harness *h, struct smtp_out *c, const struct smtp_out_result *failure)
{
	c->is_ready = true;
	c->usable = !failure;
	c->ready(c->ready_arg, c, failure);
	harness_run(h);
}

void harness_result(struct harness *h, struct smtp_out *c, const struct smtp_out_result *res)
{
	smtp_out_done_fn *done = c->done;
	assert_non_null(done);
	c->done = NULL;
	c->msg = NULL;
	if (res->error == 0 && res->stage == SMTP_STAGE_DOT && res->reply.code / 100 == 2)
		c->transactions++;
	if (res->error < 0 || res->reply.code == 421)
		c->usable = false; /* as the client is after a broken connection or a 421 */
	done(c->done_arg, c, res);
	harness_run(h);
}

static void reply_set(struct smtp_reply *rep, int code, const char *enh, const char *text)
{
	*rep = (struct smtp_reply){ .code = code, .lines = 1 };
	snprintf(rep->text, sizeof(rep->text), "%s", text ? text : "");
	rep->text_len = strlen(rep->text);
	if (enh)
		sscanf(enh, "%d.%d.%d", &rep->enh_class, &rep->enh_subject, &rep->enh_detail);
}

void harness_reply(struct harness *h, struct smtp_out *c, int code, const char *enh,
		   const int *rcpt, const char *reply_text)
{
	assert_non_null(c->msg);
	size_t n = c->msg->nrcpt;
	struct smtp_reply *rr = calloc(n, sizeof(*rr));
	assert_non_null(rr);
	bool any = false;
	for (size_t i = 0; i < n; i++) {
		int rc = rcpt ? rcpt[i] : 250;
		/* 452 is "too many recipients" (4.5.3), as servers say it */
		reply_set(&rr[i], rc, rc / 100 == 2 ? "2.1.5" : rc == 452 ? "4.5.3" :
				      rc / 100 == 4 ? "4.2.0" : "5.1.1",
			  rc / 100 == 2 ? "ok" : rc == 452 ? "too many recipients" : "refused");
		any |= rc / 100 == 2;
	}
	struct smtp_out_result res = { .stage = any ? SMTP_STAGE_DOT : SMTP_STAGE_RCPT, .why = "",
				       .rcpt = rr, .tls_version = "", .auth_mech = "" };
	if (any)
		reply_set(&res.reply, code, enh, reply_text);
	else
		res.reply = rr[n - 1];
	harness_result(h, c, &res);
	free(rr);
}

char harness_disk_status(struct harness *h, const char *id, size_t i)
{
	struct queue_msg qm;
	const char *why = NULL;
	if (queue_msg_open(queue_directory(h->q), id, &qm, &why) < 0)
		return 0;
	char st = i < qm.ix.nrcpt ? (char)qm.ix.rcpt[i].status : 0;
	queue_msg_close(&qm);
	return st;
}

bool harness_logged(struct harness *h, ...)
{
	for (size_t k = 0; k < h->nlog; k++) {
		va_list ap;
		va_start(ap, h);
		bool all = true;
		for (const char *w; (w = va_arg(ap, const char *));)
			all &= strstr(h->log[k], w) != NULL;
		va_end(ap);
		if (all)
			return true;
	}
	return false;
}

void harness_log_clear(struct harness *h)
{
	for (size_t i = 0; i < h->nlog; i++)
		free(h->log[i]);
	h->nlog = 0;
}

size_t harness_attempts(struct harness *h, const char *id, char *out, size_t len)
{
	struct buf b;
	buf_init(&b, 1 << 20);
	out[0] = '\0';
	if (queue_log_read(queue_directory(h->q), id, &b, 1 << 20) == 0)
		snprintf(out, len, "%.*s", (int)b.len, b.ptr ? b.ptr : "");
	buf_done(&b);
	return strlen(out);
}

/* ---- scripted DNS: mx.h's channel ---- */

struct fake_resolver {
	int unused;
};

struct mx_resolver *mx_resolver_new(struct event_base *base, const char *servers, char *err,
				    size_t errlen)
{
	(void)base;
	(void)servers;
	(void)err;
	(void)errlen;
	static struct fake_resolver one;
	return (struct mx_resolver *)&one;
}

struct mx_resolver *mx_resolver_free(struct mx_resolver *r)
{
	(void)r;
	for (struct mx_query *q; current && (q = current->queries);) {
		current->queries = q->next;
		free(q);
	}
	return NULL;
}

static struct mx_query *query_add(const char *name, bool tlsa, uint16_t port, void *arg)
{
	struct mx_query *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->h = current;
	snprintf(q->name, sizeof(q->name), "%s", name);
	q->tlsa = tlsa;
	q->port = port;
	q->arg = arg;
	q->next = current->queries;
	current->queries = q;
	current->lookups++;
	return q;
}

static void query_unlist(struct mx_query *q)
{
	for (struct mx_query **p = &q->h->queries; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			return;
		}
}

static struct mx_query *query_find(struct harness *h, const char *name, bool tlsa)
{
	struct mx_query *found = NULL;
	for (struct mx_query *q = h->queries; q; q = q->next)
		if (q->tlsa == tlsa && strcasecmp(q->name, name) == 0)
			found = q; /* the oldest */
	return found;
}

static void target_at_localhost(struct mx_target *t, const char *host, unsigned pref,
				uint16_t port, uint32_t ttl, bool secure)
{
	*t = (struct mx_target){ .preference = pref, .ttl = ttl, .secure = secure };
	snprintf(t->host, sizeof(t->host), "%s", host);
	struct sockaddr_in *sin = (struct sockaddr_in *)&t->addr;
	sin->sin_family = AF_INET;
	sin->sin_port = htons(port);
	sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	t->addrlen = sizeof(*sin);
}

/* An address as a smarthost: answered at once (the channel does it without DNS). */
static void on_literal(evutil_socket_t fd, short what, void *arg)
{
	struct mx_query *q = arg;
	(void)fd;
	(void)what;
	struct mx_target t;
	target_at_localhost(&t, q->name, 0, q->port, UINT32_MAX, false);
	query_unlist(q);
	mx_done_fn *done = q->done;
	void *darg = q->arg;
	free(q);
	done(darg, 0, &t, 1);
}

int mx_lookup(struct mx_resolver *r, const char *name, bool use_mx, uint16_t port,
	      mx_done_fn *done, void *arg, struct mx_query **ret)
{
	(void)r;
	(void)use_mx;
	struct mx_query *q = query_add(name, false, port, arg);
	if (!q)
		return -ENOMEM;
	q->done = done;
	*ret = q;
	struct in_addr a;
	if (!use_mx && inet_pton(AF_INET, name, &a) == 1)
		event_base_once(current->r->base, -1, EV_TIMEOUT, on_literal, q, NULL);
	return 0;
}

int mx_tlsa_lookup(struct mx_resolver *r, const char *host, uint16_t port, mx_tlsa_fn *done,
		   void *arg, struct mx_query **ret)
{
	(void)r;
	struct mx_query *q = query_add(host, true, port, arg);
	if (!q)
		return -ENOMEM;
	q->tlsa_done = done;
	*ret = q;
	return 0;
}

void mx_cancel(struct mx_query *q)
{
	if (!q)
		return;
	query_unlist(q);
	free(q);
}

bool harness_dns_waits(struct harness *h, const char *name, bool tlsa)
{
	return query_find(h, name, tlsa) != NULL;
}

void harness_dns_answer(struct harness *h, const char *name, const char *const *hosts, size_t n,
			bool secure, uint32_t ttl, int error)
{
	struct mx_query *q = query_find(h, name, false);
	assert_non_null(q);
	struct mx_target t[MX_MAX_TARGETS];
	for (size_t i = 0; i < n && i < MX_MAX_TARGETS; i++)
		target_at_localhost(&t[i], hosts[i], (unsigned)(10 * (i + 1)), q->port, ttl, secure);
	query_unlist(q);
	mx_done_fn *done = q->done;
	void *arg = q->arg;
	free(q);
	done(arg, n ? 0 : error, t, n);
	harness_run(h);
}

void harness_tlsa_answer(struct harness *h, const char *host, bool secure, int error)
{
	struct mx_query *q = query_find(h, host, true);
	assert_non_null(q);
	struct mx_tlsa_answer a = { .secure = secure, .ttl = 300 };
	query_unlist(q);
	mx_tlsa_fn *done = q->tlsa_done;
	void *arg = q->arg;
	free(q);
	done(arg, error, &a);
	harness_run(h);
}

/* ---- the scripted peer: smtp_out.h ---- */

static void on_auto_ready(evutil_socket_t fd, short what, void *arg)
{
	struct smtp_out *c = arg;
	(void)fd;
	(void)what;
	if (!c->is_ready && c->ready) {
		c->is_ready = c->usable = true;
		c->ready(c->ready_arg, c, NULL);
	}
}

struct smtp_out *smtp_out_new(struct event_base *base, const struct smtp_out_conf *conf,
			      const struct sockaddr *addr, socklen_t addrlen,
			      const struct sockaddr *source, socklen_t sourcelen)
{
	(void)addr;
	(void)addrlen;
	(void)source;
	(void)sourcelen;
	struct smtp_out *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->h = current;
	c->tls = conf->tls;
	snprintf(c->host, sizeof(c->host), "%s", conf->server_name ? conf->server_name : "");
	c->next = current->conns;
	current->conns = c;
	current->opened++;
	snprintf(c->peer, sizeof(c->peer), "peer%u[127.0.0.1]:2525", current->opened);
	if (current->auto_ready)
		event_base_once(base, -1, EV_TIMEOUT, on_auto_ready, c, NULL);
	return c;
}

static void conn_unlist(struct smtp_out *c)
{
	for (struct smtp_out **p = &c->h->conns; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			return;
		}
}

struct smtp_out *smtp_out_free(struct smtp_out *c)
{
	if (!c)
		return NULL;
	conn_unlist(c);
	if (c->freed)
		c->freed(c->freed_arg);
	free(c);
	return NULL;
}

void smtp_out_quit(struct smtp_out *c)
{
	if (c)
		c->quit = true;
	smtp_out_free(c);
}

int smtp_out_send(struct smtp_out *c, const struct smtp_out_msg *m, smtp_out_done_fn *done,
		  void *arg)
{
	if (c->done)
		return -EBUSY;
	if (!c->usable)
		return -ENOTCONN;
	c->msg = m;
	c->done = done;
	c->done_arg = arg;
	return 0;
}

void smtp_out_set_ready(struct smtp_out *c, smtp_out_ready_fn *ready, void *arg)
{
	c->ready = ready;
	c->ready_arg = arg;
}

void smtp_out_set_freed(struct smtp_out *c, void (*freed)(void *arg), void *arg)
{
	c->freed = freed;
	c->freed_arg = arg;
}

void smtp_out_set_peer_name(struct smtp_out *c, const char *name)
{
	(void)c;
	(void)name;
}

bool smtp_out_usable(const struct smtp_out *c)
{
	return c->usable && !c->done;
}

unsigned smtp_out_transactions(const struct smtp_out *c)
{
	return c->transactions;
}

const char *smtp_out_tls_auth(const struct smtp_out *c)
{
	(void)c;
	return "";
}

enum smtp_out_dane_fail smtp_out_dane_failure(const struct smtp_out *c)
{
	(void)c;
	return SMTP_DANE_FAIL_OTHER;
}

const char *smtp_out_peer(const struct smtp_out *c)
{
	return c->peer;
}

void smtp_out_abandon_quitting(struct event_base *base)
{
	(void)base;
}

const char *smtp_out_stage_name(enum smtp_out_stage st)
{
	static const char *names[] = { "connect", "greeting", "ehlo", "starttls", "auth",
				       "mail", "rcpt", "data", "dot", "rset", "quit" };
	return (size_t)st < sizeof(names) / sizeof(names[0]) ? names[st] : "stage";
}
