/*
 * store_redis -- limits shared by the nodes of a cluster, kept in Redis (one server,
 * Sentinel's master, or a Redis Cluster).
 *
 * Every decision is one Lua script (redis/gcra.lua: GCRA over all windows of every rule
 * of an event, atomically, with Redis's own clock so that nodes with skewed clocks
 * agree), and the decisions a loop makes in one pass go to Redis as one script call
 * (store_redis_loop.c batches them), which pays the script's own cost once.  Refunds and
 * class slots are scripts too.  Keys are
 *     PREFIX RULE ":" WINDOWS ":{" HASH "}"     e.g. sluice:per-domain:10/1m,500/1d:{9f0c...}
 * one per (rule, key), holding the TATs of all its windows; HASH is the (rule, key) hash
 * in hex (the seed is derived from the prefix, so every node computes the same names) and,
 * in braces, the key's hash tag: on a cluster its slot.  A key expires once it holds no
 * information.  A decision whose items fall in several slots of a cluster is split, one
 * script call per slot: each part is atomic, and a part that charged when another refused
 * the event is refunded (so a key may, for a round trip, look fuller than it is: a
 * decision can be refused for it, never admitted over it).
 *
 * Failure.  A decision never waits longer than `timeout`: past it, or at once while its
 * connection is down, it is answered by on_failure -- `local` (a memory store in this
 * process enforcing this node's share, limit / nodes), `accept` or `tempfail`.  The
 * store's state (up, or down since when and why) is reported once per transition through
 * notify().  A decision whose caller goes away while it is in flight is refunded when
 * its answer comes.
 *
 * Class slots are leases: per class a hash with, per node, its slot count and the expiry
 * of its lease; a heartbeat renews this node's leases with its own counts, and a node
 * that stops renewing (killed) stops counting once its lease expires.
 *
 * Lanes (the relay's exact sliding windows, store_slide_start()) are one sorted set per
 * window, PREFIX "lane:" NAME ":" INDEX (on a cluster "lane:{" NAME "}:" INDEX, and
 * "class:{" NAME "}" for classes, so that one script's keys share a slot), decided over
 * all windows at once by redis/slide.lua.  They have no on_failure: a timeout, a lost
 * connection or an error is answered as such, and the lane does not send (store.h says
 * why).
 *
 * Invariants: a call is answered exactly once (reply, timeout, failure) unless cancelled
 * first; what each loop owns is touched only by its own thread (store_redis_int.h).
 *
 * Rooms (store_redis_int.h): this file is the top -- the store's life, its ops table,
 * its statistics and the lanes' windows; the decisions, refunds and class slots are in
 * store_redis_decide.c, a command's arguments in store_redis_argv.c, the run-time limits
 * in store_redis_ov.c, and where requests go in the link's four rooms (each loop's part
 * in store_redis_loop.c, its connections in store_redis_link.c, its requests in
 * store_redis_req.c, what addresses and the cluster's replies say in store_redis_addr.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "store_redis_int.h"
#include "util.h"

static const struct store_ops redis_ops;

/* ---- what the store answers by itself ------------------------------------------------- */

static int redis_reset(void *ctx, uint64_t key_hash, const struct rate_limits *limits)
{
	/* only through store_decide_start() with STORE_RESET (it needs the rule name) */
	struct rstore *st = ctx;
	return st->local->ops->reset(st->local->ctx, key_hash, limits);
}

static size_t redis_top(void *ctx, struct store_top_entry *ret, size_t max, uint64_t now)
{
	(void)ctx;
	(void)ret;
	(void)max;
	(void)now;
	return 0; /* keys live in Redis; doc/CLUSTERS.md shows how to scan them */
}

static size_t redis_expire(void *ctx, uint64_t now)
{
	struct rstore *st = ctx;
	redis_ov_ensure(st);
	return st->local->ops->expire(st->local->ctx, now);
}

static void redis_stats(void *ctx, struct store_stats *ret)
{
	struct rstore *st = ctx;
	struct store_stats local;
	st->local->ops->stats(st->local->ctx, &local);
	memset(ret, 0, sizeof(*ret));
	ret->shared = true;
	ret->up = atomic_load(&st->announced) && atomic_load(&st->down) == 0;
	pthread_mutex_lock(&st->lock);
	if (st->cluster && ret->up)
		fmt_fixed(ret->state, sizeof(ret->state), "connected to cluster (%u masters, %zu "
			  "seeds)", atomic_load(&st->masters), st->nseeds);
	else if (st->state[0])
		fmt_fixed(ret->state, sizeof(ret->state), "%s", st->state);
	else
		fmt_fixed(ret->state, sizeof(ret->state), "not connected yet");
	pthread_mutex_unlock(&st->lock);
	ret->fallbacks = atomic_load(&st->fallbacks);
	ret->timeouts = atomic_load(&st->timeouts);
	ret->reconnects = atomic_load(&st->reconnects);
	ret->redirects = atomic_load(&st->redirects);
	ret->calls = atomic_load(&st->calls);
	ret->decisions = atomic_load(&st->decisions);
	ret->errors = atomic_load(&st->errors);
	/* what this process holds: the fallback's keys */
	ret->keys = local.keys;
	ret->max_keys = local.max_keys;
	ret->bytes = local.bytes;
	ret->evicted = local.evicted;
	ret->expired = local.expired;
}

static int redis_save(void *ctx, char *err, size_t errlen)
{
	(void)ctx;
	(void)err;
	(void)errlen;
	return 0; /* Redis keeps the state */
}

/* ---- lanes ---------------------------------------------------------------------------- */

/*
 * One script for every window of the lane (store.h, struct store_slide_call).  No
 * on_failure here: while Redis cannot answer, the lane does not send.
 *
 * A take's member id is MEMBER_BASE ":" SEQ, with MEMBER_BASE = NODE ":" RANDOM made once
 * per store: the node id alone is not enough, since a configured one survives a restart
 * and a counter that starts again at 1 would repeat an id still in a set -- a repeated
 * id moves its send instead of adding one, and the lane would count one send too few.
 * 48 random bits keep a restarted node apart from its earlier self.
 */
static int redis_slide_start(void *ctx, struct store_slide_call *sl)
{
	struct rstore *st = ctx;
	atomic_fetch_add(&st->decisions, 1);
	sl->member[0] = '\0';
	if (sl->take &&
	    fmt_fixed(sl->member, sizeof(sl->member), "%s:%" PRIx64, st->member_base,
		      atomic_fetch_add(&st->slide_seq, 1) + 1) < 0)
		return -EINVAL; /* cannot happen: the base is short */
	struct rloop *l = rloop_get(st);
	if (!l)
		return -EAGAIN;
	struct rreq *r = rreq_new(l, REQ_SLIDE, SC_SLIDE);
	if (!r)
		return l->nreqs >= REDIS_MAX_REQS ? -EAGAIN : -ENOMEM;
	size_t key = strlen(st->prefix) + strlen(sl->name) + 24;
	struct argv_buf *a = &r->cmd;
	if (argv_init(a, 8 + 3 * (size_t)sl->nwin, (key + 48) * sl->nwin + 256) < 0) {
		rreq_free_one(r);
		return -ENOMEM;
	}
	int bad = argv_script_head(a, SC_SLIDE, false, sl->nwin);
	for (unsigned i = 0; i < sl->nwin; i++) {
		char suffix[16];
		fmt_fixed(suffix, sizeof(suffix), ":%u", i);
		bad |= argv_add_named_key(a, st, "lane:", sl->name, suffix, &r->slot);
	}
	bad |= argv_add_cstr(a, sl->take ? "take" : "peek");
	if (sl->now)
		bad |= argv_add_u64(a, sl->now);
	else
		bad |= argv_add_cstr(a, "");
	bad |= argv_add_cstr(a, sl->take ? sl->member : "");
	for (unsigned i = 0; i < sl->nwin; i++) {
		bad |= argv_add_u64(a, sl->n[i]);
		bad |= argv_add_u64(a, sl->window_ns[i]);
	}
	if (bad) {
		rreq_free_one(r);
		return -EINVAL;
	}
	r->slide = sl;
	r->what = "lane";
	sl->req = r;
	rreq_submit(r);
	return STORE_PENDING;
}

static void redis_slide_cancel(void *ctx, struct store_slide_call *sl)
{
	(void)ctx;
	rreq_withdraw(sl->req);
	sl->req = NULL;
}

/* ---- life ----------------------------------------------------------------------------- */

static void rstore_free(struct rstore *st)
{
	if (!st)
		return;
	redis_ov_stop(atomic_load(&st->ov_sync));
	redis_links_free(st);
	store_free(st->local);
	free(st->user);
	free(st->password);
	free(st->prefix);
	free(st->master_name);
	free(st->node_id);
	free(st->sentinels);
	free(st->seeds);
	pthread_mutex_destroy(&st->lock);
	free(st);
}

static void redis_destroy(void *ctx)
{
	rstore_free(ctx);
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static int parse_addresses(const char *const *list, size_t n, struct addr **ret, char *err,
			   size_t errlen)
{
	*ret = calloc(n, sizeof(**ret));
	if (!*ret) {
		fmt_fixed(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		if (redis_addr_parse(list[i], &(*ret)[i], err, errlen) < 0)
			return -EINVAL;
	return 0;
}

/* What the link calls back here (store_redis_int.h, struct redis_callbacks). */

struct store *store_redis_new(const struct store_redis_conf *conf, char *err, size_t errlen)
{
	struct rstore *st = calloc(1, sizeof(*st));
	struct store *s = calloc(1, sizeof(*s));
	if (!st || !s) {
		free(st);
		free(s);
		fmt_fixed(err, errlen, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&st->lock, NULL);
	st->cb = redis_decide_callbacks;
	st->conf = *conf;
	st->prefix = strdup(conf->prefix ? conf->prefix : "sluice:");
	st->user = dup_or_null(conf->user);
	st->password = dup_or_null(conf->password);
	st->master_name = dup_or_null(conf->master_name);
	if (conf->node_id) {
		st->node_id = strdup(conf->node_id);
	} else {
		char host[128] = "node";
		uint32_t r = 0;
		gethostname(host, sizeof(host) - 1);
		host[sizeof(host) - 1] = '\0';
		if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
			r = (uint32_t)now_ns();
		char id[200];
		fmt_fixed(id, sizeof(id), "%s:%ld:%08x", host, (long)getpid(), r);
		st->node_id = strdup(id);
	}
	if (!st->prefix || !st->node_id || (conf->user && !st->user) ||
	    (conf->password && !st->password))
		goto nomem;
	st->conf.prefix = st->prefix;
	st->conf.node_id = st->node_id;
	uint64_t rnd = 0;
	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
		rnd = now_ns() ^ realtime_ns() ^ ((uint64_t)getpid() << 32);
	fmt_fixed(st->member_base, sizeof(st->member_base), "%.16s:%012" PRIx64, st->node_id,
		  (uint64_t)(rnd & 0xffffffffffffu));
	if (st->conf.timeout_ms == 0)
		st->conf.timeout_ms = 50;
	if (st->conf.lease_ms == 0)
		st->conf.lease_ms = 15000;
	if (st->conf.nodes == 0)
		st->conf.nodes = 1;
	if (conf->nseeds) {
		if (conf->nsentinels || conf->server) {
			fmt_fixed(err, errlen, "a cluster takes neither server nor sentinels");
			goto fail;
		}
		if (strpbrk(st->prefix, "{}")) {
			fmt_fixed(err, errlen, "a cluster's prefix cannot hold '{' or '}' (they "
				  "would put every key in one slot)");
			goto fail;
		}
		if (parse_addresses(conf->seeds, conf->nseeds, &st->seeds, err, errlen) < 0)
			goto fail;
		st->nseeds = conf->nseeds;
		st->cluster = true;
	} else if (conf->nsentinels) {
		if (!conf->master_name) {
			fmt_fixed(err, errlen, "sentinels need master_name");
			goto fail;
		}
		if (parse_addresses(conf->sentinels, conf->nsentinels, &st->sentinels, err,
				    errlen) < 0)
			goto fail;
		st->nsentinels = conf->nsentinels;
	} else if (redis_addr_parse(conf->server ? conf->server : "127.0.0.1:6379",
				    &st->server_addr, err, errlen) < 0) {
		goto fail;
	}
	struct store_memory_conf mc = { .max_keys = conf->local_max_keys, .snapshot = NULL };
	char warn[64];
	st->local = store_memory_new(&mc, realtime_ns(), warn, sizeof(warn));
	if (!st->local)
		goto nomem;
	if (st->cluster && conf->probe && redis_cluster_probe(st, err, errlen) < 0)
		goto fail;
	/* every node must name a (rule, key) alike: the seed comes from the shared prefix */
	st->local->seed = XXH64(st->prefix, strlen(st->prefix), 0x736c75696365ULL);
	s->type = "redis";
	s->ops = &redis_ops;
	s->ctx = st;
	if (!(s->ov = store_ov_new()))
		goto nomem;
	s->seed = st->local->seed;
	/* the run-time limits' thread starts at the first timer call (redis_ov_ensure()):
	 * after sluiced detached (fork), as its other threads do */
	st->self = s;
	return s;
nomem:
	fmt_fixed(err, errlen, "out of memory");
fail:
	rstore_free(st);
	if (s)
		store_ov_free(s->ov);
	free(s);
	return NULL;
}

static const struct store_ops redis_ops = {
	.decide = redis_decide,
	.decide_start = redis_decide_start,
	.cancel = redis_cancel,
	.slot_enter = redis_slot_enter,
	.slot_cancel = redis_slot_cancel,
	.slot_release = redis_slot_release,
	.slots_renew = redis_slots_renew,
	.slide_start = redis_slide_start,
	.slide_cancel = redis_slide_cancel,
	.refund = redis_refund,
	.reset = redis_reset,
	.top = redis_top,
	.expire = redis_expire,
	.stats = redis_stats,
	.save = redis_save,
	.destroy = redis_destroy,
	.ov_change = redis_ov_change,
};
