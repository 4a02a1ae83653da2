/*
 * test_store_slide -- lanes shared through a real redis-server: store_slide_start() of the
 * Redis store (store_redis.c, redis/slide.lua) on this thread's event loop.
 *
 * A private redis-server runs on a unix socket in a temporary directory (no TCP port, no
 * persistence); each test flushes it.  Checked: exact answers against a given now (admitted,
 * refused, the wait to the nanosecond, counts); several windows decided as one, a refusal
 * charging none of them; two stores ("nodes") taking in turn from one lane, answer by
 * answer against slide.c driven with the same times, and never more than N sends in any
 * window; Redis's own clock; a flushed script cache; what a lane gets while Redis is
 * stopped (-ETIMEDOUT within the timeout) or gone (-EAGAIN) and that it comes back;
 * cancel; the memory store's -ENOTSUP and the calls refused at once.
 *
 * Skipped when /usr/bin/redis-server is not installed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "slide.h"
#include "store.h"
#include "util.h"

#define REDIS_SERVER "/usr/bin/redis-server"
#define SEC 1000000000ull
#define MS 1000000ull
#define MIN (60 * SEC)
#define T0 (1700000000ull * SEC + 123456789) /* off the microsecond on purpose */
#define NEVER UINT64_MAX

/* ---- a private redis-server --------------------------------------------------------- */

struct server {
	char dir[64];
	char sock[96];
	pid_t pid;
};

static struct server srv;          /* the suite's server */
static struct event_base *base;    /* this thread's loop: the store's connections live on it */
static struct event *tick;         /* wakes the loop while a test waits */

static redisContext *cli_connect(const struct server *s)
{
	struct timeval tv = { 2, 0 };
	redisContext *c = redisConnectUnixWithTimeout(s->sock, tv);
	if (c && c->err) {
		redisFree(c);
		return NULL;
	}
	return c;
}

/* A command on a fresh blocking connection; its integer reply (-1 for anything else). */
static long long cli(const struct server *s, const char *fmt, ...)
{
	redisContext *c = cli_connect(s);
	assert_non_null(c);
	va_list ap;
	va_start(ap, fmt);
	redisReply *r = redisvCommand(c, fmt, ap);
	va_end(ap);
	assert_non_null(r);
	long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
	if (r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0)
		v = 0;
	freeReplyObject(r);
	redisFree(c);
	return v;
}

static bool server_answers(const struct server *s)
{
	redisContext *c = cli_connect(s);
	if (!c)
		return false;
	redisReply *r = redisCommand(c, "PING");
	bool ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return ok;
}

static int server_start(struct server *s)
{
	if (!s->dir[0]) {
		snprintf(s->dir, sizeof(s->dir), "/tmp/sluice-slide-XXXXXX");
		if (!mkdtemp(s->dir))
			return -errno;
		snprintf(s->sock, sizeof(s->sock), "%s/redis.sock", s->dir);
	}
	char log[128];
	snprintf(log, sizeof(log), "%s/redis.log", s->dir);
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
		}
		execl(REDIS_SERVER, REDIS_SERVER, "--port", "0", "--unixsocket", s->sock,
		      "--save", "", "--appendonly", "no", "--dir", s->dir, "--logfile", log,
		      (char *)NULL);
		_exit(127);
	}
	s->pid = pid;
	for (int i = 0; i < 1000; i++) {
		if (server_answers(s))
			return 0;
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			s->pid = 0;
			return -ECHILD;
		}
		usleep(10000);
	}
	return -ETIMEDOUT;
}

static void server_stop(struct server *s, int sig)
{
	if (s->pid <= 0)
		return;
	kill(s->pid, SIGCONT);
	kill(s->pid, sig);
	waitpid(s->pid, NULL, 0);
	s->pid = 0;
}

static void server_remove(struct server *s)
{
	server_stop(s, SIGTERM);
	if (!s->dir[0])
		return;
	char p[128];
	snprintf(p, sizeof(p), "%s/redis.log", s->dir);
	unlink(p);
	unlink(s->sock);
	rmdir(s->dir);
	s->dir[0] = '\0';
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

static int group_setup(void **state)
{
	(void)state;
	base = event_base_new();
	if (!base)
		return -1;
	thread_set_base(base);
	tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
	struct timeval tv = { 0, 2000 };
	event_add(tick, &tv);
	if (access(REDIS_SERVER, X_OK) != 0)
		return 0; /* every test skips */
	return server_start(&srv) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	server_remove(&srv);
	thread_set_base(NULL);
	event_free(tick);
	event_base_free(base);
	return 0;
}

static void need_server(void)
{
	if (srv.pid <= 0)
		skip();
	assert_int_equal(cli(&srv, "FLUSHALL"), 0);
}

/* ---- calls ---------------------------------------------------------------------------- */

static struct store *make(const struct server *s, const char *node, uint64_t timeout_ms)
{
	char addr[128], err[256] = "";
	snprintf(addr, sizeof(addr), "unix:%s", s->sock);
	struct store_redis_conf conf = { .server = addr, .prefix = "t:", .timeout_ms = timeout_ms,
					 .node_id = node, .nodes = 2, .local_max_keys = 1000,
					 .on_failure = STORE_FAIL_ACCEPT };
	struct store *st = store_redis_new(&conf, err, sizeof(err));
	if (!st)
		fail_msg("store_redis_new: %s", err);
	return st;
}

struct answer {
	int calls;
	int rc;
	uint64_t wait;
};

static void on_done(struct store_slide_call *c, int rc, uint64_t wait_ns)
{
	struct answer *a = c->arg;
	assert_null(c->req);
	a->calls++;
	a->rc = rc;
	a->wait = wait_ns;
}

/* Run the loop until *flag is set or max_ms pass. */
static void run_until(const int *flag, uint64_t max_ms)
{
	uint64_t end = now_ms() + max_ms;
	while (!*flag && now_ms() < end)
		event_base_loop(base, EVLOOP_ONCE);
}

static void run_for(uint64_t ms)
{
	int never = 0;
	run_until(&never, ms);
}

struct lane {
	const char *name;
	unsigned nwin;
	uint64_t n[RATE_MAX_WINDOWS], w[RATE_MAX_WINDOWS];
};

static void call_init(struct store_slide_call *c, const struct lane *l, bool take, uint64_t now,
		      struct answer *a)
{
	*c = (struct store_slide_call){ .name = l->name, .nwin = l->nwin, .take = take, .now = now,
					.done = on_done, .arg = a };
	memcpy(c->n, l->n, sizeof(c->n));
	memcpy(c->window_ns, l->w, sizeof(c->window_ns));
	*a = (struct answer){ 0 };
}

/* One call, waited for: its rc (1, 0 or <0, at once or through done()). */
static int slide(struct store *s, const struct lane *l, bool take, uint64_t now,
		 uint64_t *ret_wait, uint64_t *ret_count, char *ret_member)
{
	struct answer a;
	struct store_slide_call c;
	call_init(&c, l, take, now, &a);
	int rc = store_slide_start(s, &c);
	if (rc != STORE_PENDING) {
		assert_true(rc < 0);
		assert_int_equal(a.calls, 0);
		assert_null(c.req);
		return rc;
	}
	assert_non_null(c.req);
	run_until(&a.calls, 10000);
	assert_int_equal(a.calls, 1);
	assert_null(c.req);
	if (a.rc == 1)
		assert_true(a.wait == 0);
	if (a.rc == 0)
		assert_true(a.wait > 0);
	if (ret_wait)
		*ret_wait = a.wait;
	if (ret_count && a.rc >= 0)
		memcpy(ret_count, c.count, l->nwin * sizeof(*ret_count));
	if (ret_member)
		memcpy(ret_member, c.member, sizeof(c.member));
	return a.rc;
}

static uint64_t zcard(const char *lane, unsigned i)
{
	return (uint64_t)cli(&srv, "ZCARD t:lane:%s:%u", lane, i);
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_exact_answers(void **state)
{
	(void)state;
	need_server();
	struct store *s = make(&srv, "a", 5000);
	const struct lane q = { "q", 1, { 3 }, { MIN } };
	uint64_t wait, count[RATE_MAX_WINDOWS];
	char member[48];
	assert_int_equal(slide(s, &q, true, T0, &wait, count, member), 1);
	assert_true(wait == 0 && count[0] == 1);
	assert_non_null(strstr(member, "a:"));
	assert_int_equal(slide(s, &q, true, T0 + SEC, &wait, count, NULL), 1);
	assert_int_equal(slide(s, &q, true, T0 + 2 * SEC, &wait, count, NULL), 1);
	assert_true(count[0] == 3);
	/* T0 is 789 ns past its microsecond: remembered as the next one, it leaves at
	 * ceil(T0 / 1000) us + 1m; asked at T0 + 2s, that is 58s + 211 ns away */
	assert_int_equal(slide(s, &q, true, T0 + 2 * SEC, &wait, count, NULL), 0);
	assert_true(wait == 58 * SEC + 211 && count[0] == 3);
	assert_int_equal(slide(s, &q, false, T0 + MIN, &wait, count, NULL), 0);
	assert_true(wait == 211);
	assert_int_equal(slide(s, &q, false, T0 + MIN + 211, &wait, count, NULL), 1);
	assert_true(wait == 0 && count[0] == 2);
	/* a peek writes nothing: still three in the set */
	assert_true(zcard("q", 0) == 3);
	assert_int_equal(slide(s, &q, true, T0 + MIN + 211, &wait, count, NULL), 1);
	assert_true(count[0] == 3 && zcard("q", 0) == 3); /* the oldest forgotten, one added */
	/* the set's expiry: W plus a second */
	long long pttl = cli(&srv, "PTTL t:lane:q:0");
	assert_true(pttl > 59000 && pttl <= 61000);
	/* N = 0: never */
	const struct lane z = { "z", 1, { 0 }, { MIN } };
	assert_int_equal(slide(s, &z, true, T0, &wait, NULL, NULL), 0);
	assert_true(wait == NEVER);
	/* a huge wait stays exact past 2^53 ns: 300 days, asked 1 ns after the send */
	const struct lane y = { "y", 1, { 1 }, { 300 * 86400 * SEC } };
	assert_int_equal(slide(s, &y, true, T0 + 211, &wait, NULL, NULL), 1);
	assert_int_equal(slide(s, &y, false, T0 + 212, &wait, NULL, NULL), 0);
	assert_true(wait == 300 * 86400 * SEC - 1);
	store_free(s);
}

static void test_windows_as_one(void **state)
{
	(void)state;
	need_server();
	struct store *s = make(&srv, "a", 5000);
	/* 2 per second and 3 per minute */
	const struct lane l = { "m", 2, { 2, 3 }, { SEC, MIN } };
	uint64_t wait, count[RATE_MAX_WINDOWS];
	assert_int_equal(slide(s, &l, true, T0, &wait, count, NULL), 1);
	assert_int_equal(slide(s, &l, true, T0 + 1000, &wait, count, NULL), 1);
	assert_true(count[0] == 2 && count[1] == 2);
	/* the second window has room, the first does not: nothing is charged anywhere */
	assert_int_equal(slide(s, &l, true, T0 + 2000, &wait, count, NULL), 0);
	assert_true(wait == SEC - 2000 + 211);
	assert_true(count[0] == 2 && count[1] == 2);
	assert_true(zcard("m", 0) == 2 && zcard("m", 1) == 2);
	/* T0 + 1s + 211 ns is on the microsecond just past the first send's leaving */
	assert_int_equal(slide(s, &l, true, T0 + SEC + 211, &wait, count, NULL), 1);
	assert_true(count[0] == 2 && count[1] == 3);
	/* now the minute refuses (its oldest leaves at T0 + 1m) and the second has room;
	 * the take forgot the second's sends that no longer count */
	assert_int_equal(slide(s, &l, true, T0 + 3 * SEC, &wait, count, NULL), 0);
	assert_true(wait == MIN - 3 * SEC + 211);
	assert_true(count[0] == 0 && count[1] == 3);
	assert_true(zcard("m", 0) == 0 && zcard("m", 1) == 3);
	/* both refuse: the larger wait, whichever window it is */
	const struct lane b = { "b", 2, { 1, 2 }, { SEC, MIN } };
	assert_int_equal(slide(s, &b, true, T0, NULL, NULL, NULL), 1);
	assert_int_equal(slide(s, &b, true, T0 + SEC + 211, NULL, NULL, NULL), 1);
	assert_int_equal(slide(s, &b, true, T0 + SEC + 1211, &wait, count, NULL), 0);
	assert_true(wait == MIN - SEC - 1000);
	assert_true(count[0] == 1 && count[1] == 2);
	assert_int_equal(slide(s, &b, false, T0 + 2 * SEC + 211, &wait, count, NULL), 0);
	assert_true(wait == MIN - 2 * SEC);
	assert_true(count[0] == 0 && count[1] == 2);
	const struct lane full = { "f", 2, { 1, 1 }, { SEC, MIN } };
	assert_int_equal(slide(s, &full, true, T0, NULL, NULL, NULL), 1);
	assert_int_equal(slide(s, &full, true, T0 + 1000, &wait, count, NULL), 0);
	assert_true(wait == MIN - 1000 + 211);
	/* and every window that refuses with N = 0 says never */
	const struct lane zero = { "f", 2, { 1, 0 }, { SEC, MIN } };
	assert_int_equal(slide(s, &zero, false, T0 + 1000, &wait, NULL, NULL), 0);
	assert_true(wait == NEVER);
	store_free(s);
}

/* slide.c driven with the same times: one struct slide per window, a send admitted iff
 * every window admits it (peek each, then take from each). */
struct model {
	struct slide sl[RATE_MAX_WINDOWS];
};

static int model_call(struct model *m, const struct lane *l, bool take, uint64_t now,
		      uint64_t *ret_wait, uint64_t *ret_count)
{
	bool ok = true;
	uint64_t wmax = 0;
	for (unsigned i = 0; i < l->nwin; i++) {
		uint64_t w;
		if (take) /* forget what no longer counts, as the script does on every take */
			slide_take(&m->sl[i], 0, l->w[i], now, NULL);
		if (!slide_peek(&m->sl[i], l->n[i], l->w[i], now, &w)) {
			ok = false;
			wmax = w > wmax ? w : wmax;
		}
	}
	for (unsigned i = 0; i < l->nwin; i++) {
		if (ok && take)
			assert_true(slide_take(&m->sl[i], l->n[i], l->w[i], now, NULL));
		ret_count[i] = slide_count(&m->sl[i], l->w[i], now);
	}
	*ret_wait = ok ? 0 : wmax;
	return ok;
}

/* No more than n sends within any window of length w: t[k + n] - t[k] >= w, sorted. */
static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void assert_bound(uint64_t *t, size_t k, uint64_t n, uint64_t w)
{
	qsort(t, k, sizeof(*t), cmp_u64);
	for (size_t i = 0; i + n < k; i++)
		if (t[i + n] - t[i] < w)
			fail_msg("%" PRIu64 " sends within %" PRIu64 " ns: %" PRIu64 "..%" PRIu64,
				 n + 1, w, t[i], t[i + n]);
}

static void test_two_nodes_against_slide_c(void **state)
{
	(void)state;
	need_server();
	struct store *node[2] = { make(&srv, "node-a", 5000), make(&srv, "node-b", 5000) };
	/* windows off the microsecond, and a second one longer and looser */
	static const struct lane lanes[] = {
		{ "r1", 1, { 3 }, { 40 * MS + 1500 } },
		{ "r2", 2, { 2, 5 }, { 20 * MS - 1, 90 * MS + 7 } },
		{ "r3", 3, { 4, 6, 9 }, { 10 * MS + 999, 35 * MS, 120 * MS + 1 } },
	};
	uint64_t seed = 20240601;
	for (size_t li = 0; li < ARRAY_SIZE(lanes); li++) {
		const struct lane *l = &lanes[li];
		struct model m;
		for (unsigned i = 0; i < l->nwin; i++)
			assert_int_equal(slide_init(&m.sl[i], 64), 0);
		uint64_t sent[600];
		size_t nsent = 0, refused = 0;
		/* now follows the real clock plus an offset that only grows, so that the sets'
		 * expiry (from Redis's clock) never ends while a send still counts */
		uint64_t offset = 0;
		for (int step = 0; step < 300; step++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			uint64_t r = seed >> 33;
			if (r % 3)
				offset += r % (l->w[0] / l->n[0] + 5000);
			uint64_t now = realtime_ns() + offset;
			bool take = r % 7 != 0;
			uint64_t gw, mw, gc[RATE_MAX_WINDOWS], mc[RATE_MAX_WINDOWS];
			int got = slide(node[step % 2], l, take, now, &gw, gc, NULL);
			int want = model_call(&m, l, take, now, &mw, mc);
			if (got != want || gw != mw || memcmp(gc, mc, l->nwin * sizeof(gc[0])) != 0)
				fail_msg("lane %s step %d (%s at %" PRIu64 "): got %d wait %"
					 PRIu64 " count %" PRIu64 ", slide.c %d wait %" PRIu64
					 " count %" PRIu64, l->name, step, take ? "take" : "peek",
					 now, got, gw, gc[0], want, mw, mc[0]);
			if (got == 1 && take)
				sent[nsent++] = now;
			refused += got == 0;
		}
		assert_true(refused > 20 && nsent > 20);
		for (unsigned i = 0; i < l->nwin; i++) {
			assert_bound(sent, nsent, l->n[i], l->w[i]);
			slide_done(&m.sl[i]);
		}
	}
	store_free(node[0]);
	store_free(node[1]);
}

/* Both nodes as fast as they can, on Redis's clock, several calls in flight each. */
static void test_two_nodes_server_time(void **state)
{
	(void)state;
	need_server();
	struct store *node[2] = { make(&srv, "n", 5000), make(&srv, "n", 5000) };
	const struct lane l = { "fast", 2, { 5, 12 }, { 30 * MS, 200 * MS } };
	enum { INFLIGHT = 8, ROUNDS = 100 };
	uint64_t sent[INFLIGHT * ROUNDS];
	size_t nsent = 0;
	char first[48] = "";
	for (int round = 0; round < ROUNDS; round++) {
		struct store_slide_call c[INFLIGHT];
		struct answer a[INFLIGHT];
		int pending = 0;
		for (int i = 0; i < INFLIGHT; i++) {
			call_init(&c[i], &l, true, 0, &a[i]);
			assert_int_equal(store_slide_start(node[i % 2], &c[i]), STORE_PENDING);
			pending++;
		}
		/* every take has its own member, across the two stores of one node id */
		for (int i = 0; i < INFLIGHT; i++)
			for (int j = 0; j < i; j++)
				assert_string_not_equal(c[i].member, c[j].member);
		if (round == 0)
			memcpy(first, c[0].member, sizeof(first));
		else
			assert_string_not_equal(first, c[0].member);
		int done = 0;
		for (uint64_t end = now_ms() + 10000; now_ms() < end;) {
			done = 0;
			for (int i = 0; i < INFLIGHT; i++)
				done += a[i].calls;
			if (done == pending)
				break;
			event_base_loop(base, EVLOOP_ONCE);
		}
		assert_int_equal(done, pending);
		for (int i = 0; i < INFLIGHT; i++) {
			assert_true(a[i].rc == 0 || a[i].rc == 1);
			if (a[i].rc == 1) {
				/* the score it was counted with: its time on Redis's clock (us) */
				redisContext *rc = cli_connect(&srv);
				redisReply *r = redisCommand(rc, "ZSCORE t:lane:fast:1 %s",
							     c[i].member);
				assert_true(r && r->type == REDIS_REPLY_STRING);
				sent[nsent++] = strtoull(r->str, NULL, 10) * 1000;
				freeReplyObject(r);
				redisFree(rc);
			} else {
				assert_true(a[i].wait > 0 && a[i].wait <= 200 * MS);
			}
		}
		usleep(5000);
	}
	assert_true(nsent > 24);
	/* scores are whole us, as are the windows: the bound holds on them exactly */
	assert_bound(sent, nsent, 5, 30 * MS);
	assert_bound(sent, nsent, 12, 200 * MS);
	store_free(node[0]);
	store_free(node[1]);
}

static void test_server_time_and_noscript(void **state)
{
	(void)state;
	need_server();
	struct store *s = make(&srv, "a", 5000);
	const struct lane l = { "tm", 1, { 1 }, { MIN } };
	char member[48];
	uint64_t wait, count[RATE_MAX_WINDOWS];
	uint64_t t1 = realtime_ns();
	assert_int_equal(slide(s, &l, true, 0, &wait, count, member), 1);
	uint64_t t2 = realtime_ns();
	redisContext *c = cli_connect(&srv);
	redisReply *r = redisCommand(c, "ZSCORE t:lane:tm:0 %s", member);
	assert_true(r && r->type == REDIS_REPLY_STRING);
	uint64_t score = strtoull(r->str, NULL, 10);
	freeReplyObject(r);
	redisFree(c);
	assert_true(score >= t1 / 1000 - 1000 && score <= t2 / 1000 + 1000);
	assert_int_equal(slide(s, &l, false, 0, &wait, count, NULL), 0);
	assert_true(wait > MIN - 5 * SEC && wait <= MIN);
	/* the script cache flushed under the store: EVALSHA gets NOSCRIPT, EVAL answers */
	const struct lane ns = { "ns", 1, { 1 }, { MIN } };
	assert_int_equal(cli(&srv, "SCRIPT FLUSH"), 0);
	assert_int_equal(slide(s, &ns, true, T0, &wait, count, NULL), 1);
	assert_true(count[0] == 1 && zcard("ns", 0) == 1);
	assert_int_equal(cli(&srv, "SCRIPT FLUSH"), 0);
	assert_int_equal(slide(s, &ns, false, T0 + SEC, &wait, count, NULL), 0);
	assert_true(wait == MIN - SEC + 211);
	store_free(s);
}

static void test_cancel(void **state)
{
	(void)state;
	need_server();
	struct store *s = make(&srv, "a", 5000);
	const struct lane l = { "c", 1, { 5 }, { MIN } };
	/* a finished call, and one never started, may be cancelled */
	struct store_slide_call c;
	struct answer a;
	call_init(&c, &l, true, T0, &a);
	store_slide_cancel(s, &c);
	assert_int_equal(slide(s, &l, true, T0, NULL, NULL, NULL), 1);
	call_init(&c, &l, true, T0, &a);
	assert_int_equal(store_slide_start(s, &c), STORE_PENDING);
	store_slide_cancel(s, &c);
	assert_null(c.req);
	store_slide_cancel(s, &c);
	run_for(200);
	assert_int_equal(a.calls, 0);
	/* cancelled before its loop's pass sent it: it never left, and does not count */
	uint64_t count[RATE_MAX_WINDOWS];
	assert_int_equal(slide(s, &l, false, T0, NULL, count, NULL), 1);
	assert_true(count[0] == 1);
	/* cancelled on its way, while Redis is stopped: no answer at the timeout either;
	 * the take still counts when Redis runs it, which only makes the lane send less */
	struct store *quick = make(&srv, "b", 100);
	assert_int_equal(slide(quick, &l, false, T0, NULL, NULL, NULL), 1); /* connected */
	kill(srv.pid, SIGSTOP);
	call_init(&c, &l, true, T0, &a);
	assert_int_equal(store_slide_start(quick, &c), STORE_PENDING);
	run_for(20); /* sent */
	store_slide_cancel(quick, &c);
	run_for(300);
	kill(srv.pid, SIGCONT);
	run_for(100);
	assert_int_equal(a.calls, 0);
	assert_int_equal(slide(s, &l, false, T0, NULL, count, NULL), 1);
	assert_true(count[0] == 2);
	store_free(quick);
	/* freeing the store with a call in flight answers nobody */
	call_init(&c, &l, true, T0, &a);
	assert_int_equal(store_slide_start(s, &c), STORE_PENDING);
	store_free(s);
	run_for(50);
	assert_int_equal(a.calls, 0);
}

static void test_redis_stopped_times_out(void **state)
{
	(void)state;
	need_server();
	struct store *s = make(&srv, "a", 150);
	const struct lane l = { "d", 1, { 5 }, { MIN } };
	assert_int_equal(slide(s, &l, true, T0, NULL, NULL, NULL), 1);
	kill(srv.pid, SIGSTOP);
	uint64_t t = now_ms();
	int rc = slide(s, &l, true, T0, NULL, NULL, NULL);
	uint64_t took = now_ms() - t;
	kill(srv.pid, SIGCONT);
	assert_int_equal(rc, -ETIMEDOUT);
	if (took < 150 || took > 1000)
		fail_msg("answered after %" PRIu64 " ms, the timeout is 150", took);
	struct store_stats st;
	s->ops->stats(s->ctx, &st);
	assert_true(st.timeouts >= 1 && st.fallbacks == 0);
	/* the server is back: so is the lane (the stalled take may have counted) */
	int ok = 0;
	for (uint64_t end = now_ms() + 10000; now_ms() < end && ok != 1;) {
		ok = slide(s, &l, true, T0, NULL, NULL, NULL);
		if (ok != 1)
			run_for(50);
	}
	assert_int_equal(ok, 1);
	store_free(s);
}

static void test_redis_gone(void **state)
{
	(void)state;
	if (srv.pid <= 0)
		skip();
	struct server own = { 0 };
	assert_int_equal(server_start(&own), 0);
	struct store *s = make(&own, "a", 2000);
	const struct lane l = { "g", 2, { 5, 10 }, { MIN, 10 * MIN } };
	assert_int_equal(slide(s, &l, true, T0, NULL, NULL, NULL), 1);
	server_stop(&own, SIGKILL);
	/* at once, or as soon as the connection is seen to be lost: never admitted, never
	 * by on_failure (here `accept`), and well before the timeout */
	uint64_t t = now_ms();
	for (int i = 0; i < 3; i++) {
		int rc = slide(s, &l, true, T0, NULL, NULL, NULL);
		assert_int_equal(rc, -EAGAIN);
	}
	assert_true(now_ms() - t < 1000);
	struct store_stats st;
	s->ops->stats(s->ctx, &st);
	assert_true(st.fallbacks == 0 && !st.up);
	/* nothing listens at all: the same */
	struct server none = { 0 };
	snprintf(none.sock, sizeof(none.sock), "%s/nothing.sock", own.dir);
	struct store *s2 = make(&none, "b", 2000);
	t = now_ms();
	assert_int_equal(slide(s2, &l, true, T0, NULL, NULL, NULL), -EAGAIN);
	assert_int_equal(slide(s2, &l, false, T0, NULL, NULL, NULL), -EAGAIN);
	assert_true(now_ms() - t < 1000);
	store_free(s2);
	/* back: the lane works again once the connection is re-made (backoff from 100 ms);
	 * the restarted server lost the set, as a real one without persistence would */
	assert_int_equal(server_start(&own), 0);
	int rc = -EAGAIN;
	for (uint64_t end = now_ms() + 15000; now_ms() < end && rc != 1;) {
		rc = slide(s, &l, true, T0, NULL, NULL, NULL);
		if (rc != 1) {
			assert_int_equal(rc, -EAGAIN);
			run_for(50);
		}
	}
	assert_int_equal(rc, 1);
	store_free(s);
	server_remove(&own);
}

static void test_refused_at_once(void **state)
{
	(void)state;
	struct answer a;
	struct store_slide_call c;
	const struct lane l = { "x", 1, { 1 }, { MIN } };
	/* the memory store: the lane keeps its own slide.c */
	char warn[64];
	struct store_memory_conf mc = { .max_keys = 10 };
	struct store *mem = store_memory_new(&mc, T0, warn, sizeof(warn));
	assert_non_null(mem);
	call_init(&c, &l, true, T0, &a);
	assert_int_equal(store_slide_start(mem, &c), -ENOTSUP);
	store_slide_cancel(mem, &c);
	store_free(mem);
	/* calls out of bounds, before anything is sent */
	struct server none = { 0 };
	snprintf(none.sock, sizeof(none.sock), "/nonexistent/redis.sock");
	struct store *s = make(&none, "a", 100);
	static const struct {
		const char *name;
		unsigned nwin;
		bool no_done;
	} bad[] = {
		{ NULL, 1, false }, { "", 1, false }, { "x", 0, false },
		{ "x", RATE_MAX_WINDOWS + 1, false }, { "x", 1, true },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		call_init(&c, &l, true, T0, &a);
		c.name = bad[i].name;
		c.nwin = bad[i].nwin;
		if (bad[i].no_done)
			c.done = NULL;
		assert_int_equal(store_slide_start(s, &c), -EINVAL);
	}
	char longname[STORE_SLIDE_NAME + 2];
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	call_init(&c, &l, true, T0, &a);
	c.name = longname;
	assert_int_equal(store_slide_start(s, &c), -EINVAL);
	longname[STORE_SLIDE_NAME] = '\0';
	assert_int_not_equal(store_slide_start(s, &c), -EINVAL);
	store_slide_cancel(s, &c);
	/* a thread with no event loop cannot ask Redis */
	thread_set_base(NULL);
	call_init(&c, &l, true, T0, &a);
	assert_int_equal(store_slide_start(s, &c), -EAGAIN);
	thread_set_base(base);
	store_free(s);
	/* filled from a configured rate list */
	struct rate_limits rl = {
		2, { { .count = 8, .period_ns = MIN, .burst = 8 },
		     { .count = 10000, .period_ns = 86400 * SEC, .burst = 20 } }
	};
	store_slide_set_limits(&c, &rl);
	assert_true(c.nwin == 2 && c.n[0] == 8 && c.window_ns[0] == MIN && c.n[1] == 10000 &&
		    c.window_ns[1] == 86400 * SEC);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exact_answers),
		cmocka_unit_test(test_windows_as_one),
		cmocka_unit_test(test_two_nodes_against_slide_c),
		cmocka_unit_test(test_two_nodes_server_time),
		cmocka_unit_test(test_server_time_and_noscript),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_redis_stopped_times_out),
		cmocka_unit_test(test_redis_gone),
		cmocka_unit_test(test_refused_at_once),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
