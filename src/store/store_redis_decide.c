/*
 * store_redis_decide -- the Redis store's calls that Redis answers: decisions, refunds
 * and class slots, with what answers them when Redis cannot (store_redis_int.h).
 *
 * A decision is one part of a gcra.lua call: the decisions a loop queued in one pass,
 * bound for one connection (and one slot on a cluster), go as one script call
 * (redis_send_decisions(), which the link's flush calls through st->cb), and the reply's
 * parts answer them in order.  A decision whose items fall in several slots of a cluster
 * is split, one call per slot (struct djoin); what a part charged that the event's refusal
 * does not keep is refunded.  A decision that cannot be asked (no loop, the loop's bound,
 * a connection down, its deadline) is answered by on_failure (fallback_decide(): the
 * local store with this node's share, accept or tempfail), as is a class slot
 * (fallback_slot()).  A decision withdrawn in flight leaves the link a copy whose answer
 * refunds it (redis_orphan()).  Refunds and slot releases and renewals are commands
 * nobody waits for.
 *
 * Invariants: a call is answered exactly once (reply, on_failure, or the copy's refund)
 * unless its caller withdrew first; a reply that contradicts itself is not believed.
 * Calls the link, the arguments (store_redis_argv.c) and store_redis_ov.c (the
 * heartbeat starts its thread), never store_redis.c; the link calls back only through
 * redis_decide_callbacks.  Runs on the loop of the request (a worker's, or the main
 * loop), but for the synchronous redis_decide() (any thread, on_failure only).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_redis_int.h"
#include "util.h"

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
static void redis_fail(struct rreq *r, int err)
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

int redis_decide_start(void *ctx, struct store_call *call)
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

void redis_cancel(void *ctx, struct store_call *call)
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
int redis_decide(void *ctx, struct store_item *items, size_t n, enum store_mode mode,
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

void redis_refund(void *ctx, const struct store_item *items, size_t n, uint64_t now)
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

/* ---- class slots ---------------------------------------------------------------------- */

int redis_slot_enter(void *ctx, struct store_slot_call *sc)
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
	argv_add_named_key(&r->cmd, st, "class:", sc->cls, "", &r->slot);
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

void redis_slot_cancel(void *ctx, struct store_slot_call *sc)
{
	(void)ctx;
	rreq_withdraw(sc->req);
	sc->req = NULL;
}

void redis_slot_release(void *ctx, const char *cls)
{
	struct rstore *st = ctx;
	struct rloop *l = rloop_get(st);
	struct argv_buf a;
	uint16_t slot;
	if (!l || argv_init(&a, 8, 1024 + strlen(st->prefix) + strlen(cls)) < 0)
		return; /* the next renewal sets this node's count right */
	argv_script_head(&a, SC_SLOT_RELEASE, false, 1);
	argv_add_named_key(&a, st, "class:", cls, "", &slot);
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
		argv_add_named_key(&a, st, "class:", cls[i], "", &slot);
	argv_add_cstr(&a, st->node_id);
	argv_add_u64(&a, st->conf.lease_ms);
	argv_add_cstr(&a, "");
	for (size_t i = 0; i < n; i++)
		argv_add_u64(&a, counts[i]);
	send_other(st, l, &a, SC_SLOT_RENEW, slot, "lease renewal");
}

void redis_slots_renew(void *ctx, const char *const *cls, const unsigned *counts, size_t n)
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

/* What the link calls back here (store_redis_int.h, struct redis_callbacks). */
const struct redis_callbacks redis_decide_callbacks = {
	.fail = redis_fail,
	.send_decisions = redis_send_decisions,
	.orphan = redis_orphan,
	.answer = redis_answer,
};
