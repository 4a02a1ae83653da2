/*
 * metrics -- the Prometheus endpoint and the exposition format (see metrics.h).
 *
 * libevent 2.1's evhttp has no limit on connections, so the server counts them itself:
 * evhttp asks us for each new connection's bufferevent (evhttp_set_bevcb), and we keep a
 * reference to it to learn when evhttp is done with it (see sweep()).  At max_connections
 * the listener is disabled until one closes; evhttp's timeout closes idle and unfinished
 * connections.  XXX a closed connection's socket stays open until the next sweep (100
 * ms): the price of counting with libevent 2.1's public API only.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "listen.h"
#include "log.h"
#include "metrics.h"
#include "util.h"

struct metrics {
	struct listen_addr addr;
	int fd;                      /* bound, until evhttp takes it */
	struct event_base *base;
	struct evhttp *http;
	struct evconnlistener *listener;
	struct event *stop_ev;
	int stop_fd;
	pthread_t thread;
	bool started;
	unsigned max_connections;
	bool paused;                 /* the listener is disabled: at max_connections */
	bool closing;                /* evhttp_free() under way: the listener is gone */
	struct bufferevent **bevs;   /* every connection's, with a reference of ours */
	size_t nbevs, cap;
	struct event *sweep_ev;
	metrics_render_fn *render;
	void *arg;
};

/* ---- connections ---- */

/*
 * Connections the server has made, and their end.  evhttp frees a connection's
 * bufferevent with bufferevent_free(), which clears its callbacks; we hold a reference
 * of our own, so the bufferevent (and its socket) stays until sweep() sees the cleared
 * callbacks and drops it.  evhttp's error callback is set for as long as it uses the
 * connection.
 */
static void sweep(struct metrics *m)
{
	size_t k = 0;
	for (size_t i = 0; i < m->nbevs; i++) {
		bufferevent_event_cb ecb = NULL;
		bufferevent_getcb(m->bevs[i], NULL, NULL, &ecb, NULL);
		if (ecb || m->closing)
			m->bevs[k++] = m->bevs[i];
		else
			bufferevent_decref(m->bevs[i]); /* the last reference: closes the socket */
	}
	m->nbevs = k;
	if (m->paused && !m->closing && k < m->max_connections) {
		m->paused = false;
		evconnlistener_enable(m->listener);
	}
	if (k && !m->closing) {
		struct timeval tv = { 0, 100 * 1000 };
		evtimer_add(m->sweep_ev, &tv);
	}
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	sweep(arg);
}

static struct bufferevent *conn_new(struct event_base *base, void *arg)
{
	struct metrics *m = arg;
	sweep(m);
	if (m->nbevs == m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 8;
		struct bufferevent **b = realloc(m->bevs, cap * sizeof(*b));
		if (!b)
			return NULL; /* evhttp makes its own, uncounted: only without memory */
		m->bevs = b;
		m->cap = cap;
	}
	struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!bev)
		return NULL;
	bufferevent_incref(bev);
	m->bevs[m->nbevs++] = bev;
	if (m->nbevs >= m->max_connections && !m->paused) {
		m->paused = true;
		evconnlistener_disable(m->listener);
	}
	if (!evtimer_pending(m->sweep_ev, NULL)) {
		struct timeval tv = { 0, 100 * 1000 };
		evtimer_add(m->sweep_ev, &tv);
	}
	return bev;
}

/* ---- requests ---- */

static void send_text(struct evhttp_request *req, int code, const char *reason, const char *text)
{
	struct evbuffer *b = evbuffer_new();
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	evhttp_add_header(h, "Content-Type", "text/plain; charset=utf-8");
	if (b)
		evbuffer_add(b, text, strlen(text));
	evhttp_send_reply(req, code, reason, b);
	if (b)
		evbuffer_free(b);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct metrics *m = arg;
	const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
	const char *path = u ? evhttp_uri_get_path(u) : NULL;
	enum evhttp_cmd_type t = evhttp_request_get_command(req);
	if (!path || strcmp(path, "/metrics") != 0) {
		send_text(req, 404, "Not Found", "not found: the metrics are at /metrics\n");
		return;
	}
	if (t != EVHTTP_REQ_GET && t != EVHTTP_REQ_HEAD) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
		send_text(req, 405, "Method Not Allowed", "method not allowed: GET /metrics\n");
		return;
	}
	struct buf page;
	buf_init(&page, METRICS_MAX_PAGE);
	int r = m->render(m->arg, &page);
	struct evbuffer *b = evbuffer_new();
	if (r < 0 || !b || evbuffer_add(b, page.ptr, page.len) < 0) {
		log_debug("metrics: cannot render the page: %s", strerror(r < 0 ? -r : ENOMEM));
		buf_done(&page);
		if (b)
			evbuffer_free(b);
		send_text(req, 500, "Internal Server Error", "the metrics cannot be rendered\n");
		return;
	}
	buf_done(&page);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; version=0.0.4; charset=utf-8");
	evhttp_send_reply(req, 200, "OK", b);
	evbuffer_free(b);
}

/* ---- life cycle ---- */

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
	struct metrics *m = arg;
	(void)fd;
	(void)what;
	event_base_loopbreak(m->base);
}

int metrics_new(const char *address, unsigned max_connections, metrics_render_fn *render,
		void *arg, struct metrics **ret, char *err, size_t errlen)
{
	struct metrics *m = calloc(1, sizeof(*m));
	if (!m) {
		fmt_fixed(err, errlen, "out of memory");
		return -ENOMEM;
	}
	m->fd = -1;
	m->stop_fd = -1;
	m->max_connections = max_connections ? max_connections : 1;
	m->render = render;
	m->arg = arg;
	int r = listen_addr_parse(address, &m->addr, err, errlen);
	if (r == 0)
		r = listen_open(&m->addr, 0600, (uid_t)-1, (gid_t)-1, &m->fd, err, errlen);
	if (r < 0) {
		free(m);
		return r;
	}
	*ret = m;
	return 0;
}

static void *metrics_main(void *arg)
{
	struct metrics *m = arg;
	thread_set_base(m->base);
	event_base_dispatch(m->base);
	thread_set_base(NULL);
	return NULL;
}

const struct listen_addr *metrics_address(const struct metrics *m)
{
	return &m->addr;
}

/* The loop and the server are made here, after the daemon forks (an epoll descriptor
 * made before would be shared with the parent). */
int metrics_start(struct metrics *m)
{
	m->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	m->base = m->stop_fd >= 0 ? event_base_new() : NULL;
	m->http = m->base ? evhttp_new(m->base) : NULL;
	struct evhttp_bound_socket *bound = m->http ? evhttp_accept_socket_with_handle(m->http, m->fd)
						    : NULL;
	if (bound)
		m->fd = -1; /* the listener owns it now */
	m->listener = bound ? evhttp_bound_socket_get_listener(bound) : NULL;
	m->stop_ev = m->listener ? event_new(m->base, m->stop_fd, EV_READ, on_stop, m) : NULL;
	m->sweep_ev = m->stop_ev ? evtimer_new(m->base, on_sweep, m) : NULL;
	if (!m->sweep_ev || event_add(m->stop_ev, NULL) < 0)
		return -ENOMEM;
	/* a backlog the size of the cap: what waits beyond it waits in SYN queues, and one
	 * readiness of the listener cannot accept much past max_connections */
	listen(evconnlistener_get_fd(m->listener), (int)m->max_connections);
	evhttp_set_max_headers_size(m->http, METRICS_MAX_HEADERS);
	evhttp_set_max_body_size(m->http, METRICS_MAX_BODY); /* read, then answered 405 */
	evhttp_set_timeout(m->http, METRICS_TIMEOUT_S);
	/* every method evhttp parses reaches on_request, which answers 405 */
	evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
				   EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
				   EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	evhttp_set_bevcb(m->http, conn_new, m);
	evhttp_set_gencb(m->http, on_request, m);
	int r = pthread_create(&m->thread, NULL, metrics_main, m);
	if (r != 0)
		return -r;
	m->started = true;
	return 0;
}

struct metrics *metrics_free(struct metrics *m)
{
	if (!m)
		return NULL;
	if (m->started) {
		uint64_t one = 1;
		ssize_t w = write(m->stop_fd, &one, sizeof(one));
		(void)w; /* an eventfd takes it */
		pthread_join(m->thread, NULL);
	}
	if (m->stop_ev)
		event_free(m->stop_ev);
	m->closing = true;
	if (m->http)
		evhttp_free(m->http); /* closes the listening socket and the connections */
	for (size_t i = 0; i < m->nbevs; i++)
		bufferevent_decref(m->bevs[i]);
	free(m->bevs);
	if (m->sweep_ev)
		event_free(m->sweep_ev);
	if (m->fd >= 0)
		listen_close(&m->addr, m->fd);
	else if (m->addr.ss.ss_family == AF_UNIX && m->addr.path[0])
		unlink(m->addr.path);
	if (m->base)
		event_base_free(m->base);
	if (m->stop_fd >= 0)
		close(m->stop_fd);
	free(m);
	return NULL;
}

/* ---- the exposition format ---- */

static int label_value(struct buf *out, const char *v)
{
	int r = 0;
	for (const char *p = v ? v : ""; *p && r == 0; p++) {
		if (*p == '\\')
			r = buf_append_cstr(out, "\\\\");
		else if (*p == '"')
			r = buf_append_cstr(out, "\\\"");
		else if (*p == '\n')
			r = buf_append_cstr(out, "\\n");
		else
			r = buf_append_byte(out, (unsigned char)*p);
	}
	return r;
}

static int labels(struct buf *out, const struct metrics_label *l, size_t nl, const char *le)
{
	if (nl == 0 && !le)
		return 0;
	int r = buf_append_byte(out, '{');
	for (size_t i = 0; i < nl && r == 0; i++) {
		r = buf_printf(out, "%s%s=\"", i ? "," : "", l[i].name);
		if (r == 0)
			r = label_value(out, l[i].value);
		if (r == 0)
			r = buf_append_byte(out, '"');
	}
	if (r == 0 && le)
		r = buf_printf(out, "%sle=\"%s\"", nl ? "," : "", le);
	if (r == 0)
		r = buf_append_byte(out, '}');
	return r;
}

int metrics_family(struct buf *out, const char *name, const char *type, const char *help)
{
	return buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int metrics_sample_u64(struct buf *out, const char *name, const struct metrics_label *l,
		       size_t nl, uint64_t v)
{
	int r = buf_append_cstr(out, name);
	if (r == 0)
		r = labels(out, l, nl, NULL);
	if (r == 0)
		r = buf_printf(out, " %llu\n", (unsigned long long)v);
	return r;
}

static int value(struct buf *out, double v)
{
	if (isnan(v))
		return buf_append_cstr(out, " NaN\n");
	if (isinf(v))
		return buf_append_cstr(out, v > 0 ? " +Inf\n" : " -Inf\n");
	return buf_printf(out, " %.17g\n", v);
}

int metrics_sample(struct buf *out, const char *name, const struct metrics_label *l, size_t nl,
		   double v)
{
	int r = buf_append_cstr(out, name);
	if (r == 0)
		r = labels(out, l, nl, NULL);
	if (r == 0)
		r = value(out, v);
	return r;
}

int metrics_histogram(struct buf *out, const char *name, const struct metrics_label *l,
		      size_t nl, const struct stat_hist *h)
{
	uint64_t cum = 0;
	int r = 0;
	for (unsigned i = 0; i < STAT_HIST_BUCKETS && r == 0; i++) {
		char le[32];
		cum += h->bucket[i];
		if (i < STAT_HIST_EDGES)
			fmt_fixed(le, sizeof(le), "%g", stat_hist_le[i]);
		else
			fmt_fixed(le, sizeof(le), "+Inf");
		r = buf_printf(out, "%s_bucket", name);
		if (r == 0)
			r = labels(out, l, nl, le);
		if (r == 0)
			r = buf_printf(out, " %llu\n", (unsigned long long)cum);
	}
	if (r == 0)
		r = buf_printf(out, "%s_sum", name);
	if (r == 0)
		r = labels(out, l, nl, NULL);
	if (r == 0)
		r = value(out, h->sum);
	if (r == 0)
		r = buf_printf(out, "%s_count", name);
	if (r == 0)
		r = labels(out, l, nl, NULL);
	if (r == 0)
		r = buf_printf(out, " %llu\n", (unsigned long long)cum);
	return r;
}

/* ---- /proc figures ---- */

int metrics_proc_stat_parse(const char *text, long tck, long page, uint64_t btime,
			    struct metrics_proc_stat *ret)
{
	/* the command name (2nd field) is in parentheses and may hold anything: fields 3 on
	 * start after the last ')' */
	const char *p = strrchr(text, ')');
	if (!p || p[1] != ' ' || !p[2])
		return -EINVAL;
	unsigned long long f[21];    /* f[k] is field k + 4 (field 3, the state, is a letter) */
	size_t i = 0;
	p += 2;                      /* ") S ..." */
	while (*p && *p != ' ')
		p++;
	for (; i < ARRAY_SIZE(f) && *p == ' '; i++) {
		char *end;
		f[i] = strtoull(p + 1, &end, 10); /* a negative field (nice) wraps: unused */
		if (end == p + 1)
			break;
		p = end;
	}
	if (i < ARRAY_SIZE(f))
		return -EINVAL;
	/* utime 14, stime 15, num_threads 20, starttime 22 (ticks since boot), vsize 23,
	 * rss 24 (in pages) */
	double hz = (double)(tck > 0 ? tck : 100);
	ret->cpu_seconds = (double)(f[10] + f[11]) / hz;
	ret->start_time = (double)btime + (double)f[18] / hz;
	ret->threads = f[16];
	ret->vsize = f[19];
	ret->rss = f[20] * (uint64_t)(page > 0 ? page : 4096);
	return 0;
}

uint64_t metrics_boot_time_parse(const char *text)
{
	for (const char *p = text; p; p = strchr(p, '\n')) {
		if (*p == '\n')
			p++;
		unsigned long long v;
		if (strncmp(p, "btime ", 6) == 0 && sscanf(p + 6, "%llu", &v) == 1)
			return v;
	}
	return 0;
}
