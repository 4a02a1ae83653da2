/*
 * store_redis -- limits shared by the nodes of a cluster, kept in Redis (one server,
 * Sentinel's master, or a Redis Cluster).
 *
 * Every decision is one Lua script (redis/gcra.lua: GCRA over all windows of every rule
 * of an event, atomically, with Redis's own clock so that nodes with skewed clocks
 * agree), and the decisions a loop makes in one pass go to Redis as one script call
 * (store_redis_link.c batches them), which pays the script's own cost once.  Refunds and
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

/* ---- arguments ------------------------------------------------------------------------ */

/* One allocation for the pointers, the lengths and the text: a command makes one. */
int argv_init(struct argv_buf *a, size_t cap, size_t text)
{
	size_t ptrs = cap * (sizeof(*a->argv) + sizeof(*a->len));
	void *block = malloc(ptrs + text);
	if (!block)
		return -ENOMEM;
	a->argv = block;
	a->len = (size_t *)(a->argv + cap);
	a->text = (char *)block + ptrs;
	a->n = a->used = 0;
	a->cap = cap;
	a->size = text;
	return 0;
}

/* Room for n more bytes of text and one more argument, or NULL. */
char *argv_room(struct argv_buf *a, size_t n)
{
	if (a->n == a->cap || a->size - a->used < n + 1)
		return NULL;
	return a->text + a->used;
}

int argv_commit(struct argv_buf *a, size_t n)
{
	a->argv[a->n] = a->text + a->used;
	a->len[a->n] = n;
	a->text[a->used + n] = '\0';
	a->n++;
	a->used += n + 1;
	return 0;
}

int argv_add_cstr(struct argv_buf *a, const char *v)
{
	size_t n = strlen(v);
	char *p = argv_room(a, n);
	if (!p)
		return -ENOBUFS;
	memcpy(p, v, n);
	return argv_commit(a, n);
}

/* A decimal number (every script argument but a few is one): no printf on this path. */
int argv_add_u64(struct argv_buf *a, uint64_t v)
{
	char tmp[20];
	size_t n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	char *p = argv_room(a, n);
	if (!p)
		return -ENOBUFS;
	for (size_t i = 0; i < n; i++)
		p[i] = tmp[n - 1 - i];
	return argv_commit(a, n);
}

int argv_add(struct argv_buf *a, const char *fmt, ...)
{
	if (a->n == a->cap)
		return -ENOBUFS;
	va_list ap;
	va_start(ap, fmt);
	int w = vsnprintf(a->text + a->used, a->size - a->used, fmt, ap);
	va_end(ap);
	if (w < 0 || (size_t)w >= a->size - a->used)
		return -ENOBUFS;
	a->argv[a->n] = a->text + a->used;
	a->len[a->n] = (size_t)w;
	a->n++;
	a->used += (size_t)w + 1;
	return 0;
}

int argv_add_bytes(struct argv_buf *a, const char *p, size_t n)
{
	if (a->n == a->cap)
		return -ENOBUFS;
	a->argv[a->n] = p;
	a->len[a->n] = n;
	a->n++;
	return 0;
}

int argv_script_head(struct argv_buf *a, enum script_id sc, bool eval, uint64_t nkeys)
{
	if (!eval) {
		argv_add_bytes(a, "EVALSHA", 7);
		argv_add_bytes(a, redis_scripts[sc].sha1, 40);
	} else {
		argv_add_bytes(a, "EVAL", 4);
		argv_add_bytes(a, redis_scripts[sc].text, redis_scripts[sc].len);
	}
	return argv_add_u64(a, nkeys);
}

static const char hex_digits[] = "0123456789abcdef";

/* The Redis key of an item: PREFIX RULE ":" WINDOW["," WINDOW...] ":{" HASH16 "}". */
static int add_key(struct argv_buf *a, const struct rstore *st, struct str rule,
		   const struct rate_limits *l, uint64_t key_hash)
{
	char wt[RATE_MAX_WINDOWS * 64];
	size_t lw = 0;
	for (unsigned j = 0; j < l->n && j < RATE_MAX_WINDOWS; j++) {
		if (j)
			wt[lw++] = ',';
		rate_window_format(&l->w[j], wt + lw, sizeof(wt) - lw);
		lw += strlen(wt + lw);
	}
	size_t lp = strlen(st->prefix);
	char *p = argv_room(a, lp + rule.len + 1 + lw + 3 + 16);
	if (!p)
		return -ENOBUFS;
	char *q = p;
	memcpy(q, st->prefix, lp);
	q += lp;
	if (rule.len)
		memcpy(q, rule.ptr, rule.len);
	q += rule.len;
	*q++ = ':';
	memcpy(q, wt, lw);
	q += lw;
	*q++ = ':';
	*q++ = '{';
	for (int i = 15; i >= 0; i--)
		*q++ = hex_digits[(key_hash >> (i * 4)) & 15];
	*q++ = '}';
	return argv_commit(a, (size_t)(q - p));
}

/* The cluster slot of an item's key: its hash tag is the hash in hex. */
static uint16_t item_slot(uint64_t key_hash)
{
	char h[16];
	for (int i = 15; i >= 0; i--)
		h[15 - i] = hex_digits[(key_hash >> (i * 4)) & 15];
	return redis_key_slot(h, sizeof(h));
}

/* ---- answers without Redis ------------------------------------------------------------ */

static uint64_t share(uint64_t v, unsigned nodes)
{
	uint64_t s = nodes > 1 ? v / nodes : v;
	return s ? s : 1;
}

/* on_failure for a decision. */
static int fallback_decide(struct rstore *st, struct store_call *call)
{
	atomic_fetch_add(&st->fallbacks, 1);
	struct store_item *items = call->items;
	size_t n = call->n;
	switch (st->conf.on_failure) {
	case STORE_FAIL_ACCEPT:
		for (size_t i = 0; i < n; i++) {
			items[i].ok = true;
			items[i].charged = false;
			items[i].retry_ns = 0;
			memset(items[i].used, 0, sizeof(items[i].used));
		}
		return call->mode == STORE_RESET ? 0 : 1;
	case STORE_FAIL_TEMPFAIL:
		for (size_t i = 0; i < n; i++) {
			items[i].ok = false;
			items[i].charged = false;
		}
		return call->mode == STORE_RESET ? 0 : STORE_TEMPFAIL;
	case STORE_FAIL_LOCAL:
		break;
	}
	if (call->mode == STORE_RESET) {
		int any = 0;
		for (size_t i = 0; i < n; i++)
			any |= st->local->ops->reset(st->local->ctx, items[i].key_hash,
						     items[i].limits) > 0;
		return any;
	}
	/* this node's share of every window, for the time Redis is away */
	struct rate_limits scaled[64];
	const struct rate_limits *orig[64];
	int rc = 1;
	for (size_t off = 0; off < n; off += 64) {
		size_t k = n - off < 64 ? n - off : 64;
		for (size_t i = 0; i < k; i++) {
			struct store_item *it = &items[off + i];
			orig[i] = it->limits;
			scaled[i] = *it->limits;
			for (unsigned j = 0; j < scaled[i].n; j++) {
				scaled[i].w[j].count = share(scaled[i].w[j].count, st->conf.nodes);
				scaled[i].w[j].burst = share(scaled[i].w[j].burst, st->conf.nodes);
			}
			it->limits = &scaled[i];
		}
		int r = st->local->ops->decide(st->local->ctx, items + off, k, call->mode,
					       realtime_ns());
		for (size_t i = 0; i < k; i++)
			items[off + i].limits = orig[i];
		if (r < 0)
			return r;
		if (r == 0)
			rc = 0;
	}
	return rc;
}

static int fallback_slot(struct rstore *st, struct store_slot_call *c)
{
	atomic_fetch_add(&st->fallbacks, 1);
	c->fallback = true;
	switch (st->conf.on_failure) {
	case STORE_FAIL_ACCEPT:
		return 1;
	case STORE_FAIL_TEMPFAIL:
		return STORE_TEMPFAIL; /* no verdict: a class takes it as full */
	case STORE_FAIL_LOCAL:
		break;
	}
	return c->local_used <= share(c->cap, st->conf.nodes) ? 1 : 0;
}

/* Answer r's caller by on_failure (a lane, which has none, by err); r leaves the
 * deadline list.  Nothing for a request already answered.  (st->cb.fail) */
static void rreq_fail(struct rreq *r, int err)
{
	if (!r || !r->waiting)
		return;
	struct rstore *st = r->loop->st;
	struct store_call *call = r->call;
	struct store_slot_call *sc = r->slotc;
	struct store_slide_call *sl = r->slide;
	bool orphan = r->orphan;
	r->slotc = NULL;
	r->slide = NULL;
	if (!orphan)
		r->call = NULL;
	/* leaves the deadline list first: a done() may start a new request */
	rreq_leave(r);
	if (r->kind == REQ_SLIDE && sl) {
		sl->req = NULL;
		sl->done(sl, err, 0);
	} else if (r->kind == REQ_DECIDE && call && !orphan) {
		call->req = NULL;
		call->done(call, fallback_decide(st, call));
	} else if (r->kind == REQ_SLOT && sc) {
		sc->req = NULL;
		sc->done(sc, fallback_slot(st, sc));
	}
}

/* ---- decisions ------------------------------------------------------------------------ */

/* Elements of a decision's part of gcra.lua's reply: pass, then per item ok, charged,
 * retry, used per window, known for a distinct item, blocked for an item with a block. */
static size_t decide_reply_len(const struct store_call *call)
{
	size_t k = 1;
	for (size_t i = 0; i < call->n; i++)
		k += 3 + call->items[i].limits->n + !!(call->items[i].flags & STORE_DISTINCT) +
		     !!call->items[i].block_ns;
	return k;
}

/* The sorted set of a distinct item's values: its key's name and ":v" (the same hash
 * tag, so the same slot). */
static int add_values_key(struct argv_buf *a, const struct rstore *st, const struct store_item *it)
{
	if (add_key(a, st, it->rule, it->limits, it->key_hash) < 0 || a->size - a->used < 2)
		return -ENOBUFS;
	/* the name just committed grows in place: its NUL is the text's last byte */
	memcpy(a->text + a->used - 1, ":v", 3);
	a->len[a->n - 1] += 2;
	a->used += 2;
	return 0;
}

/* Send the decisions q[0..n), bound for one connection (and one slot), as one script
 * call: 0, or <0 (nothing sent; the caller fails them).  (st->cb.send_decisions) */
static int redis_send_decisions(struct redis_conn *c, struct rreq **q, size_t n, bool eval,
				bool asking)
{
	const struct rstore *st = c->st;
	/* text: per item its key (and a distinct item's values key, 2 bytes longer): prefix,
	 * rule, ':', each window's text (at most 47 bytes with its comma), ":{" HASH16 "}",
	 * ":v", NUL; and its arguments, each a decimal of at most 20 digits and a NUL: cost,
	 * flags, nwin, value, block, and T, burst, period per window */
	size_t keys = 0, args = 0, text = 256, lp = strlen(st->prefix);
	for (size_t d = 0; d < n; d++) {
		const struct store_call *call = q[d]->call;
		keys += redis_call_keys(call);
		args += 2;
		text += 32;
		for (size_t i = 0; i < call->n; i++) {
			size_t nw = call->items[i].limits->n;
			args += 5 + 3 * nw;
			text += 2 * (lp + call->items[i].rule.len + 24 + 48 * nw) + 21 * (5 + 3 * nw);
		}
	}
	struct argv_buf a;
	if (argv_init(&a, 8 + keys + args, text) < 0)
		return -ENOMEM;
	bool reset = n == 1 && q[0]->call->mode == STORE_RESET;
	if (reset)
		argv_add_bytes(&a, "DEL", 3);
	else
		argv_script_head(&a, SC_GCRA, eval, keys);
	for (size_t d = 0; d < n; d++) {
		const struct store_call *call = q[d]->call;
		for (size_t i = 0; i < call->n; i++) {
			if (add_key(&a, st, call->items[i].rule, call->items[i].limits,
				    call->items[i].key_hash) < 0)
				goto overflow;
			if (!reset && (call->items[i].flags & STORE_DISTINCT) &&
			    add_values_key(&a, st, &call->items[i]) < 0)
				goto overflow;
		}
	}
	if (!reset) {
		int bad = argv_add_bytes(&a, "", 0);
		bad |= argv_add_u64(&a, n);
		for (size_t d = 0; d < n; d++) {
			const struct store_call *call = q[d]->call;
			q[d]->reply_len = decide_reply_len(call);
			if (call->mode == STORE_PEEK)
				bad |= argv_add_bytes(&a, "peek", 4);
			else
				bad |= argv_add_bytes(&a, "check", 5);
			bad |= argv_add_u64(&a, call->n);
			for (size_t i = 0; i < call->n; i++) {
				const struct store_item *it = &call->items[i];
				bool distinct = it->flags & STORE_DISTINCT;
				bool block = it->block_ns != 0;
				bad |= argv_add_u64(&a, it->cost);
				bad |= argv_add_u64(&a, (it->flags & (STORE_BLOCKING |
								      STORE_COUNT_REJECTED)) |
						       (distinct ? 4u : 0u) | (block ? 8u : 0u));
				bad |= argv_add_u64(&a, it->limits->n);
				if (distinct)
					bad |= argv_add_u64(&a, it->value_hash);
				if (block)
					bad |= argv_add_u64(&a, it->block_ns);
				for (unsigned j = 0; j < it->limits->n; j++) {
					bad |= argv_add_u64(&a, gcra_interval(&it->limits->w[j]));
					bad |= argv_add_u64(&a, it->limits->w[j].burst);
					if (distinct)
						bad |= argv_add_u64(&a, it->limits->w[j].period_ns /
									1000000ULL);
				}
			}
		}
		if (bad)
			goto overflow; /* a call's arguments are all there or none is sent */
	}
	int rc = redis_conn_send_reqs(c, q, n, eval, asking, reset ? "reset" : "decision",
				      (int)a.n, a.argv, a.len);
	argv_clear(&a);
	if (rc == 0)
		atomic_fetch_add(&c->st->calls, 1);
	return rc;
overflow:
	argv_clear(&a);
	return -ENOBUFS;
}

static uint64_t reply_u64(const redisReply *r)
{
	if (r->type == REDIS_REPLY_INTEGER)
		return r->integer < 0 ? 0 : (uint64_t)r->integer;
	if (r->type == REDIS_REPLY_STRING) {
		errno = 0;
		unsigned long long v = strtoull(r->str, NULL, 10);
		return errno == ERANGE ? UINT64_MAX : v;
	}
	return 0;
}

/* One decision's part el[0..nel) of a reply into items: 1, 0, or -EPROTO. */
static int parse_decide_part(redisReply *const *el, size_t nel, struct store_item *items, size_t n)
{
	if (nel < 1)
		return -EPROTO;
	size_t k = 1;
	for (size_t i = 0; i < n; i++) {
		struct store_item *it = &items[i];
		unsigned nw = it->limits->n <= RATE_MAX_WINDOWS ? it->limits->n : RATE_MAX_WINDOWS;
		bool distinct = it->flags & STORE_DISTINCT, block = it->block_ns != 0;
		if (k > nel || nel - k < 3 + (size_t)nw + distinct + block)
			return -EPROTO;
		it->ok = reply_u64(el[k]) != 0;
		it->charged = reply_u64(el[k + 1]) != 0;
		it->retry_ns = reply_u64(el[k + 2]);
		k += 3;
		for (unsigned j = 0; j < nw; j++)
			it->used[j] = reply_u64(el[k++]);
		it->known = distinct && reply_u64(el[k++]) != 0;
		it->blocked = block && reply_u64(el[k++]) != 0;
		/* a reply that contradicts itself is not believed */
		if (it->charged && !it->ok)
			return -EPROTO;
	}
	return reply_u64(el[0]) != 0;
}

int store_redis_parse_decide(const void *reply, struct store_item *items, size_t n,
			     enum store_mode mode)
{
	const redisReply *r = reply;
	if (mode == STORE_RESET)
		return r->type == REDIS_REPLY_INTEGER ? r->integer > 0 : -EPROTO;
	if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
		return -EPROTO;
	return parse_decide_part(r->element, r->elements, items, n);
}

/* The answer to a decision whose caller withdrew while it was in flight: give back what
 * it charged. */
static void orphan_done(struct store_call *c, int rc)
{
	struct store *s = c->arg;
	if (rc >= 0)
		s->ops->refund(s->ctx, c->items, c->n, realtime_ns());
}

/* A copy of a decision in flight whose caller withdrew: its done() refunds what the
 * answer says was charged.  NULL for a decision that charges nothing, or no memory.
 * (st->cb.orphan) */
static struct store_call *redis_orphan(const struct store_call *c)
{
	if (c->mode != STORE_CHECK || c->n == 0)
		return NULL;
	size_t names = 0;
	for (size_t i = 0; i < c->n; i++)
		names += c->items[i].rule.len;
	struct store_call *o = calloc(1, sizeof(*o) + c->n * (sizeof(struct store_item) +
							       sizeof(struct rate_limits)) + names);
	if (!o)
		return NULL;
	struct store_item *items = (struct store_item *)(o + 1);
	struct rate_limits *limits = (struct rate_limits *)(items + c->n);
	char *text = (char *)(limits + c->n);
	for (size_t i = 0; i < c->n; i++) {
		items[i] = c->items[i];
		limits[i] = *c->items[i].limits;
		items[i].limits = &limits[i];
		memcpy(text, c->items[i].rule.ptr, c->items[i].rule.len);
		items[i].rule = (struct str){ text, c->items[i].rule.len };
		items[i].key = (struct str){ NULL, 0 };
		text += c->items[i].rule.len;
	}
	o->items = items;
	o->n = c->n;
	o->mode = c->mode;
	o->now = c->now;
	o->done = orphan_done;
	o->arg = c->store;
	return o;
}

static void answer_decision(struct rstore *st, struct rreq *r, redisReply *const *el, size_t nel,
			    const redisReply *whole)
{
	struct store_call *call = r->call;
	bool orphan = r->orphan;
	rreq_leave(r);
	if (!orphan)
		r->call = NULL;
	call->req = NULL;
	int rc = call->mode == STORE_RESET ? store_redis_parse_decide(whole, call->items, call->n,
								      call->mode)
					   : parse_decide_part(el, nel, call->items, call->n);
	if (rc < 0) {
		atomic_fetch_add(&st->errors, 1);
		if (orphan)
			return; /* nothing known to give back */
		rc = fallback_decide(st, call);
	}
	call->done(call, rc);
}

/* lanes: slide.lua's reply { ok, wait_ns, count per window }: 1 or 0 with *ret_wait (0
 * when admitted) and sl->count set, or -EPROTO (nothing set) for a reply of the wrong
 * shape or one that contradicts itself (admitted with a wait, refused with none). */
static int parse_slide(const redisReply *r, struct store_slide_call *sl, uint64_t *ret_wait)
{
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 + (size_t)sl->nwin)
		return -EPROTO;
	const redisReply *ok = r->element[0], *w = r->element[1];
	if (ok->type != REDIS_REPLY_INTEGER || (ok->integer != 0 && ok->integer != 1) ||
	    w->type != REDIS_REPLY_STRING || w->len == 0 || w->len > 20)
		return -EPROTO;
	uint64_t wait = 0;
	for (size_t i = 0; i < w->len; i++) {
		unsigned d = (unsigned char)w->str[i] - '0';
		if (d > 9 || __builtin_mul_overflow(wait, 10, &wait) ||
		    __builtin_add_overflow(wait, d, &wait))
			return -EPROTO;
	}
	if ((ok->integer == 1) != (wait == 0))
		return -EPROTO;
	uint64_t count[RATE_MAX_WINDOWS];
	for (unsigned i = 0; i < sl->nwin; i++) {
		const redisReply *e = r->element[2 + i];
		if (e->type != REDIS_REPLY_INTEGER || e->integer < 0)
			return -EPROTO;
		count[i] = (uint64_t)e->integer;
	}
	memcpy(sl->count, count, sl->nwin * sizeof(count[0]));
	*ret_wait = wait;
	return (int)ok->integer;
}

/* Answer the requests of a reply that is no redirection or connection error.
 * (st->cb.answer) */
static void redis_answer(struct rsent *s, redisReply *rep)
{
	struct rstore *st = s->conn->st;
	if (s->n == 0)
		return;
	if (s->decisions) {
		/* a batch: each decision's part, in order (one answered meanwhile by its
		 * deadline still has its part) */
		size_t total = 0;
		for (size_t i = 0; i < s->n; i++)
			total += s->r[i]->reply_len;
		bool shaped = rep->type == REDIS_REPLY_ARRAY && rep->elements == total;
		size_t off = 0;
		for (size_t i = 0; i < s->n; i++) {
			struct rreq *r = s->r[i];
			if (r->waiting && r->call) {
				if (shaped)
					answer_decision(st, r, rep->element + off, r->reply_len, rep);
				else
					answer_decision(st, r, NULL, 0, rep);
			}
			off += r->reply_len;
		}
		return;
	}
	struct rreq *r = s->r[0];
	if (!r->waiting)
		return;
	switch (r->kind) {
	case REQ_DECIDE:
		if (r->call)
			answer_decision(st, r, NULL, 0, rep);
		break;
	case REQ_SLOT: {
		struct store_slot_call *sc = r->slotc;
		r->slotc = NULL;
		rreq_leave(r);
		if (!sc)
			break;
		sc->req = NULL;
		int rc;
		if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1)
			rc = reply_u64(rep->element[0]) ? 1 : 0;
		else {
			atomic_fetch_add(&st->errors, 1);
			rc = fallback_slot(st, sc);
		}
		sc->done(sc, rc);
		break;
	}
	case REQ_SLIDE: {
		struct store_slide_call *sl = r->slide;
		r->slide = NULL;
		rreq_leave(r);
		if (!sl)
			break;
		sl->req = NULL;
		uint64_t wait = 0;
		int rc = parse_slide(rep, sl, &wait);
		if (rc < 0)
			atomic_fetch_add(&st->errors, 1);
		sl->done(sl, rc, rc == 0 ? wait : 0);
		break;
	}
	case REQ_OTHER:
		rreq_leave(r);
		break;
	}
}

/* ---- operations ----------------------------------------------------------------------- */

/*
 * A decision split over the slots of a cluster: one part per slot, each a call of its
 * own over copies of its items.  When every part has answered, the results go back into
 * the caller's items; if the event is refused, what a part charged that the refusal does
 * not keep (items without STORE_COUNT_REJECTED) is refunded.
 */
struct djoin {
	enum req_holder holder;     /* HOLD_JOIN (first, as in struct rreq) */
	struct rstore *st;
	struct store *store;
	struct store_call *parent;
	size_t nparts, left;
	bool starting;              /* parts are being started: none finishes the join */
	int rc[64];
	struct store_call part[64];
	size_t *index;              /* part items' places in the parent's items */
	struct store_item *items;   /* the parts' items, part after part */
};

static void join_free(struct djoin *j)
{
	free(j->index);
	free(j->items);
	free(j);
}

/* Every part has answered: the caller's items and the decision's result. */
static int join_finish(struct djoin *j)
{
	struct store_call *parent = j->parent;
	int all = 1;
	for (size_t i = 0; i < j->nparts; i++) {
		if (j->rc[i] < 0 && (all >= 0 || j->rc[i] == STORE_TEMPFAIL))
			all = j->rc[i];
		else if (j->rc[i] == 0 && all == 1)
			all = 0;
	}
	size_t at = 0;
	struct store_item back[64];
	size_t nback = 0;
	for (size_t i = 0; i < j->nparts; i++)
		for (size_t k = 0; k < j->part[i].n; k++, at++) {
			struct store_item *it = &j->items[at];
			if (all != 1 && it->charged &&
			    (all < 0 || !(it->flags & STORE_COUNT_REJECTED))) {
				/* XXX a distinct value stays counted (refund_some skips it) */
				if (nback < 64)
					back[nback++] = *it;
				it->charged = false;
			}
			struct store_item *dst = &parent->items[j->index[at]];
			dst->ok = it->ok;
			dst->known = it->known;
			dst->blocked = it->blocked;
			dst->charged = it->charged;
			dst->retry_ns = it->retry_ns;
			memcpy(dst->used, it->used, sizeof(dst->used));
		}
	if (nback)
		j->store->ops->refund(j->store->ctx, back, nback, realtime_ns());
	parent->req = NULL;
	join_free(j);
	return all;
}

static void join_part_done(struct store_call *pc, int rc)
{
	struct djoin *j = pc->arg;
	j->rc[pc - j->part] = rc;
	if (--j->left > 0 || j->starting)
		return;
	struct store_call *parent = j->parent;
	parent->done(parent, join_finish(j));
}

static int decide_one(struct rstore *st, struct store_call *call, uint16_t slot);

/* Split call over its slots: STORE_PENDING, or the result now (every part answered at
 * once: on_failure). */
static int decide_split(struct rstore *st, struct store_call *call)
{
	struct djoin *j = calloc(1, sizeof(*j));
	uint16_t *slot = calloc(call->n, sizeof(*slot));
	bool *taken = calloc(call->n, sizeof(*taken));
	if (j) {
		j->index = calloc(call->n, sizeof(*j->index));
		j->items = calloc(call->n, sizeof(*j->items));
	}
	if (!j || !slot || !taken || !j->index || !j->items || call->n > 64) {
		free(slot);
		free(taken);
		if (j)
			join_free(j);
		return fallback_decide(st, call);
	}
	j->holder = HOLD_JOIN;
	j->st = st;
	j->store = call->store;
	j->parent = call;
	for (size_t i = 0; i < call->n; i++)
		slot[i] = item_slot(call->items[i].key_hash);
	/* parts in the order of their first item; items keep their order within a part */
	size_t at = 0;
	uint16_t pslot[64];
	for (size_t i = 0; i < call->n; i++) {
		if (taken[i])
			continue;
		pslot[j->nparts] = slot[i];
		struct store_call *pc = &j->part[j->nparts++];
		pc->items = &j->items[at];
		for (size_t k = i; k < call->n; k++)
			if (!taken[k] && slot[k] == slot[i]) {
				taken[k] = true;
				j->items[at] = call->items[k];
				j->index[at++] = k;
				pc->n++;
			}
		pc->mode = call->mode;
		pc->now = call->now;
		pc->done = join_part_done;
		pc->arg = j;
		pc->store = call->store;
	}
	free(taken);
	free(slot);
	j->left = j->nparts;
	j->starting = true;
	call->req = j;
	for (size_t p = 0; p < j->nparts; p++) {
		int rc = decide_one(st, &j->part[p], pslot[p]);
		if (rc != STORE_PENDING)
			join_part_done(&j->part[p], rc);
	}
	j->starting = false;
	if (j->left == 0)
		return join_finish(j);
	return STORE_PENDING;
}

static int decide_one(struct rstore *st, struct store_call *call, uint16_t slot)
{
	struct rloop *l = rloop_get(st);
	struct rreq *r = l ? rreq_new(l, REQ_DECIDE, SC_GCRA) : NULL;
	if (!r)
		return fallback_decide(st, call);
	r->call = call;
	r->slot = slot;
	call->req = r;
	rreq_submit(r);
	return STORE_PENDING;
}

static int redis_decide_start(void *ctx, struct store_call *call)
{
	struct rstore *st = ctx;
	atomic_fetch_add(&st->decisions, 1);
	if (call->n == 0)
		return 1;
	if (!st->cluster)
		return decide_one(st, call, 0);
	uint16_t slot = item_slot(call->items[0].key_hash);
	for (size_t i = 1; i < call->n; i++)
		if (item_slot(call->items[i].key_hash) != slot)
			return decide_split(st, call);
	return decide_one(st, call, slot);
}

static void redis_cancel(void *ctx, struct store_call *call)
{
	(void)ctx;
	if (!call->req)
		return;
	if (*(enum req_holder *)call->req == HOLD_JOIN) {
		struct djoin *j = call->req;
		for (size_t p = 0; p < j->nparts; p++)
			if (j->part[p].req)
				rreq_withdraw(j->part[p].req);
		join_free(j);
	} else {
		rreq_withdraw(call->req);
	}
	call->req = NULL;
}

/* The synchronous decide(): only what on_failure would say (no thread waits on Redis). */
static int redis_decide(void *ctx, struct store_item *items, size_t n, enum store_mode mode,
			uint64_t now)
{
	struct rstore *st = ctx;
	struct store_call call = { .items = items, .n = n, .mode = mode, .now = now };
	return fallback_decide(st, &call);
}

/* Queue a command nobody waits for (what says what it was, for errors). */
static void send_other(struct rstore *st, struct rloop *l, struct argv_buf *a, enum script_id sc,
		       uint16_t slot, const char *what)
{
	struct rreq *r = rreq_new(l, REQ_OTHER, sc);
	if (!r) {
		argv_clear(a);
		return;
	}
	(void)st;
	r->cmd = *a;
	r->slot = slot;
	r->what = what;
	rreq_submit(r);
}

/* refund.lua over items[0..n) that charged (all in one slot on a cluster). */
/* Is this item's charge given back by a refund?  Not a distinct value's (store.h). */
static inline bool refundable(const struct store_item *it)
{
	return it->charged && it->cost && !(it->flags & STORE_DISTINCT);
}

static void refund_some(struct rstore *st, struct rloop *l, const struct store_item *items,
			size_t n)
{
	size_t nk = 0, text = 256, args = 8;
	for (size_t i = 0; i < n; i++)
		if (refundable(&items[i])) {
			nk++;
			args += 3 + items[i].limits->n;
			text += items[i].rule.len + strlen(st->prefix) + 24 +
				(size_t)items[i].limits->n * 88;
		}
	if (nk == 0)
		return;
	struct argv_buf a;
	if (argv_init(&a, args, text) < 0)
		return;
	int bad = argv_script_head(&a, SC_REFUND, false, nk);
	uint16_t slot = 0;
	for (size_t i = 0; i < n; i++)
		if (refundable(&items[i])) {
			bad |= add_key(&a, st, items[i].rule, items[i].limits, items[i].key_hash);
			slot = item_slot(items[i].key_hash);
		}
	bad |= argv_add_bytes(&a, "", 0);
	bad |= argv_add_u64(&a, nk);
	for (size_t i = 0; i < n; i++) {
		if (!refundable(&items[i]))
			continue;
		bad |= argv_add_u64(&a, items[i].cost);
		bad |= argv_add_u64(&a, items[i].limits->n);
		for (unsigned j = 0; j < items[i].limits->n; j++)
			bad |= argv_add_u64(&a, gcra_interval(&items[i].limits->w[j]));
	}
	if (bad) {
		argv_clear(&a);
		return;
	}
	send_other(st, l, &a, SC_REFUND, slot, "refund");
}

static void redis_refund(void *ctx, const struct store_item *items, size_t n, uint64_t now)
{
	struct rstore *st = ctx;
	/* the local share too: what it charged while Redis was away comes back the same way */
	if (st->local)
		st->local->ops->refund(st->local->ctx, items, n, now);
	struct rloop *l = n ? rloop_get(st) : NULL;
	if (!l)
		return;
	if (!st->cluster) {
		refund_some(st, l, items, n);
		return;
	}
	for (size_t i = 0; i < n; i++) /* one slot each */
		refund_some(st, l, &items[i], 1);
}

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

/* A lane's or a class's key: PREFIX KIND NAME, or PREFIX KIND "{" NAME "}" on a cluster
 * (its slot comes from the name alone).  The slot in *ret_slot. */
static int add_named_key(struct argv_buf *a, const struct rstore *st, const char *kind,
			 const char *name, const char *suffix, uint16_t *ret_slot)
{
	*ret_slot = st->cluster ? redis_key_slot(name, strlen(name)) : 0;
	if (st->cluster)
		return argv_add(a, "%s%s{%s}%s", st->prefix, kind, name, suffix);
	return argv_add(a, "%s%s%s%s", st->prefix, kind, name, suffix);
}

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
		bad |= add_named_key(a, st, "lane:", sl->name, suffix, &r->slot);
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

/* ---- class slots ---------------------------------------------------------------------- */

static int redis_slot_enter(void *ctx, struct store_slot_call *sc)
{
	struct rstore *st = ctx;
	struct rloop *l = rloop_get(st);
	struct rreq *r = l ? rreq_new(l, REQ_SLOT, SC_SLOT_ENTER) : NULL;
	if (!r || argv_init(&r->cmd, 16, 1024 + strlen(st->prefix) + strlen(sc->cls)) < 0) {
		if (r)
			rreq_free_one(r);
		return fallback_slot(st, sc);
	}
	argv_script_head(&r->cmd, SC_SLOT_ENTER, false, 1);
	add_named_key(&r->cmd, st, "class:", sc->cls, "", &r->slot);
	argv_add_cstr(&r->cmd, st->node_id);
	argv_add_u64(&r->cmd, sc->cap);
	argv_add_u64(&r->cmd, st->conf.lease_ms);
	argv_add_cstr(&r->cmd, "");
	r->slotc = sc;
	r->what = "slot";
	sc->req = r;
	rreq_submit(r);
	return STORE_PENDING;
}

static void redis_slot_cancel(void *ctx, struct store_slot_call *sc)
{
	(void)ctx;
	rreq_withdraw(sc->req);
	sc->req = NULL;
}

static void redis_slot_release(void *ctx, const char *cls)
{
	struct rstore *st = ctx;
	struct rloop *l = rloop_get(st);
	struct argv_buf a;
	uint16_t slot;
	if (!l || argv_init(&a, 8, 1024 + strlen(st->prefix) + strlen(cls)) < 0)
		return; /* the next renewal sets this node's count right */
	argv_script_head(&a, SC_SLOT_RELEASE, false, 1);
	add_named_key(&a, st, "class:", cls, "", &slot);
	argv_add_cstr(&a, st->node_id);
	send_other(st, l, &a, SC_SLOT_RELEASE, slot, "slot release");
}

/* slot_renew.lua over classes cls[0..n) (one slot on a cluster). */
static void renew_some(struct rstore *st, struct rloop *l, const char *const *cls,
		       const unsigned *counts, size_t n)
{
	size_t text = 256 + strlen(st->node_id);
	for (size_t i = 0; i < n; i++)
		text += strlen(st->prefix) + strlen(cls[i]) + 32;
	struct argv_buf a;
	uint16_t slot = 0;
	if (argv_init(&a, 8 + 2 * n, text) < 0)
		return;
	argv_script_head(&a, SC_SLOT_RENEW, false, n);
	for (size_t i = 0; i < n; i++)
		add_named_key(&a, st, "class:", cls[i], "", &slot);
	argv_add_cstr(&a, st->node_id);
	argv_add_u64(&a, st->conf.lease_ms);
	argv_add_cstr(&a, "");
	for (size_t i = 0; i < n; i++)
		argv_add_u64(&a, counts[i]);
	send_other(st, l, &a, SC_SLOT_RENEW, slot, "lease renewal");
}

static void redis_slots_renew(void *ctx, const char *const *cls, const unsigned *counts, size_t n)
{
	struct rstore *st = ctx;
	redis_ov_ensure(st);
	/* also with no class: the heartbeat makes the main loop's connections at start, so
	 * that a store that cannot be reached is said before the first decision */
	struct rloop *l = rloop_get(st);
	if (!l || n == 0)
		return;
	if (!st->cluster) {
		renew_some(st, l, cls, counts, n);
		return;
	}
	for (size_t i = 0; i < n; i++)
		renew_some(st, l, &cls[i], &counts[i], 1);
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
static const struct redis_callbacks link_callbacks = {
	.fail = rreq_fail,
	.send_decisions = redis_send_decisions,
	.orphan = redis_orphan,
	.answer = redis_answer,
};

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
	st->cb = link_callbacks;
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
