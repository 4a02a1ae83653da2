/*
 * store_redis_ov -- the run-time per-key limits of a Redis store: the truth in Redis, a
 * copy on every node (store_ov.c), kept in step by a thread of its own.
 *
 * In Redis: a hash PREFIX "{ov}" (field: the (rule, key)'s key_hash in 16 hex digits;
 * value: "1 UNTIL_NS WINDOWS RULE KEY", see redis_ov_format()) and its version PREFIX
 * "{ov}:v", both under one hash tag (one slot on a cluster).  Only the scripts ov_set.lua
 * and ov_del.lua change them, each changing the hash and incrementing the version at
 * once; ov_read.lua reads both at once.
 *
 * The thread.  It owns one synchronous hiredis connection (1 s timeouts: it is the only
 * thing that waits on it, never a session's loop -- law 1), made on demand: to the
 * server, to the master the sentinels name, or on a cluster to a seed, following one
 * MOVED to the master of the {ov} slot.  Every second it asks for the version; when it
 * differs from the one its table came from it reads the whole hash and replaces the
 * node's table (entries past STORE_OV_MAX, or malformed, are skipped and logged once).
 * Changes (store_ov_change() -> redis_ov_change()) are queued to it; it runs the script,
 * applies the change to this node's table once Redis took it, and answers done() from
 * this thread.  While Redis is unreachable a change fails with -EAGAIN (nothing changes
 * anywhere) and the node keeps its last table; that is logged once per outage.
 *
 * Threads: struct rov is shared between the thread and the callers of redis_ov_change()
 * under its lock (the queue, stop); everything else is the thread's.  The thread starts
 * at the main thread's first timer call (redis_ov_ensure()), not in store_redis_new():
 * sluiced forks to detach after it made its store, and a thread does not survive that.
 * Until it has polled once (about a second after start) the node's table is empty.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "store_redis_int.h"
#include "util.h"

#define OV_POLL_MS 1000
#define OV_TIMEOUT_MS 1000
#define OV_VALUE_MAX (2 + 21 + RATE_MAX_WINDOWS * 64 + STORE_OV_RULE + RATE_MAX_OVERRIDE_KEY + 8)

struct rov {
	struct rstore *st;
	struct store *s;
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;                          /* under lock */
	struct store_ov_call *q_head, *q_tail; /* under lock: changes to make */
	/* the thread's */
	redisContext *c;
	struct addr at;                     /* where c goes */
	bool have_version;
	bool unknown;                       /* the last command may have gone out unanswered */
	uint64_t version;
	bool down_logged;
	bool skip_logged;
	char h_key[300], v_key[300];
};

/* ---- the value ---------------------------------------------------------------------- */

/* "1 UNTIL_NS WINDOWS RULE KEY": WINDOWS is "0" (unlimited) or "COUNT/PERIOD_NS/BURST"
 * joined by commas, all decimal.  The rule holds no space; the key is the rest (it may). */
int redis_ov_format(const struct store_ov_entry *e, char *buf, size_t len)
{
	size_t n = 0;
	int w = snprintf(buf, len, "1 %" PRIu64 " ", e->until_ns);
	if (w < 0 || (size_t)w >= len)
		return -ENOSPC;
	n = (size_t)w;
	if (e->limits.n == 0) {
		w = snprintf(buf + n, len - n, "0");
		if (w < 0 || (size_t)w >= len - n)
			return -ENOSPC;
		n += (size_t)w;
	}
	for (unsigned i = 0; i < e->limits.n; i++) {
		w = snprintf(buf + n, len - n, "%s%" PRIu64 "/%" PRIu64 "/%" PRIu64, i ? "," : "",
			     e->limits.w[i].count, e->limits.w[i].period_ns, e->limits.w[i].burst);
		if (w < 0 || (size_t)w >= len - n)
			return -ENOSPC;
		n += (size_t)w;
	}
	w = snprintf(buf + n, len - n, " %.*s %.*s", (int)e->rule.len, e->rule.ptr,
		     (int)e->key.len, e->key.ptr);
	if (w < 0 || (size_t)w >= len - n)
		return -ENOSPC;
	return (int)(n + (size_t)w);
}

/* A decimal u64 of 1..20 digits, all of p[0..n): 0 or -1. */
static int parse_u64(const char *p, size_t n, uint64_t *ret)
{
	if (n == 0 || n > 20)
		return -1;
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (p[i] < '0' || p[i] > '9')
			return -1;
		unsigned d = (unsigned)(p[i] - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*ret = v;
	return 0;
}

int store_redis_ov_parse_entry(struct str field, struct str value,
			       struct store_ov_entry *ret)
{
	struct store_ov_entry e = { 0 };
	if (field.len != 16 || value.len > OV_VALUE_MAX)
		return -EPROTO;
	for (size_t i = 0; i < 16; i++) {
		int d = hex_value(field.ptr[i]);
		if (d < 0)
			return -EPROTO;
		e.key_hash = e.key_hash << 4 | (uint64_t)d;
	}
	const char *p = value.ptr, *end = value.ptr + value.len;
	/* "1 " */
	if (end - p < 2 || p[0] != '1' || p[1] != ' ')
		return -EPROTO;
	p += 2;
	const char *sp = memchr(p, ' ', (size_t)(end - p));
	if (!sp || parse_u64(p, (size_t)(sp - p), &e.until_ns) < 0)
		return -EPROTO;
	p = sp + 1;
	sp = memchr(p, ' ', (size_t)(end - p));
	if (!sp)
		return -EPROTO;
	struct str wins = str_make(p, (size_t)(sp - p));
	p = sp + 1;
	if (!(wins.len == 1 && wins.ptr[0] == '0')) {
		const char *q = wins.ptr, *wend = wins.ptr + wins.len;
		while (q < wend) {
			if (e.limits.n == RATE_MAX_WINDOWS)
				return -EPROTO;
			const char *comma = memchr(q, ',', (size_t)(wend - q));
			const char *tend = comma ? comma : wend;
			const char *s1 = memchr(q, '/', (size_t)(tend - q));
			const char *s2 = s1 ? memchr(s1 + 1, '/', (size_t)(tend - s1 - 1)) : NULL;
			struct rate_window *w = &e.limits.w[e.limits.n];
			if (!s2 || parse_u64(q, (size_t)(s1 - q), &w->count) < 0 ||
			    parse_u64(s1 + 1, (size_t)(s2 - s1 - 1), &w->period_ns) < 0 ||
			    parse_u64(s2 + 1, (size_t)(tend - s2 - 1), &w->burst) < 0)
				return -EPROTO;
			e.limits.n++;
			if (!comma)
				break;
			q = comma + 1;
			if (q == wend)
				return -EPROTO; /* a trailing comma */
		}
		if (e.limits.n == 0)
			return -EPROTO;
	}
	sp = memchr(p, ' ', (size_t)(end - p));
	if (!sp)
		return -EPROTO;
	e.rule = str_make(p, (size_t)(sp - p));
	e.key = str_make(sp + 1, (size_t)(end - sp - 1));
	if (!store_ov_entry_valid(&e))
		return -EPROTO;
	*ret = e;
	return 0;
}

int store_redis_ov_parse(const void *reply, uint64_t *ret_version,
			 struct store_ov_entry **ret, size_t *ret_n, size_t *ret_skipped)
{
	const redisReply *r = reply;
	if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
		return -EPROTO;
	const redisReply *v = r->element[0], *h = r->element[1];
	uint64_t version;
	if (!v || !h)
		return -EPROTO;
	if (v->type == REDIS_REPLY_INTEGER && v->integer >= 0)
		version = (uint64_t)v->integer;
	else if (v->type != REDIS_REPLY_STRING || !v->str ||
		 parse_u64(v->str, (size_t)v->len, &version) < 0)
		return -EPROTO;
	if (h->type != REDIS_REPLY_ARRAY || h->elements % 2 != 0)
		return -EPROTO;
	size_t pairs = h->elements / 2;
	size_t cap = pairs < STORE_OV_MAX ? pairs : STORE_OV_MAX;
	struct store_ov_entry *e = malloc((cap ? cap : 1) * sizeof(*e));
	if (!e)
		return -ENOMEM;
	size_t n = 0, skipped = 0;
	for (size_t i = 0; i < pairs; i++) {
		const redisReply *f = h->element[2 * i], *x = h->element[2 * i + 1];
		if (!f || !x || f->type != REDIS_REPLY_STRING || x->type != REDIS_REPLY_STRING ||
		    !f->str || !x->str || n == cap) {
			skipped++;
			continue;
		}
		if (store_redis_ov_parse_entry(str_make(f->str, (size_t)f->len),
					       str_make(x->str, (size_t)x->len), &e[n]) < 0) {
			skipped++;
			continue;
		}
		n++;
	}
	*ret_version = version;
	*ret = e;
	*ret_n = n;
	*ret_skipped = skipped;
	return 0;
}

/* ---- the connection ------------------------------------------------------------------ */

static void ov_log(struct rov *o, bool bad, const char *msg)
{
	if (o->st->conf.notify)
		o->st->conf.notify(o->st->conf.notify_arg, bad, msg);
}

static void drop_conn(struct rov *o)
{
	if (o->c)
		redisFree(o->c);
	o->c = NULL;
}

static redisContext *connect_addr(const struct addr *a)
{
	struct timeval tv = { OV_TIMEOUT_MS / 1000, (OV_TIMEOUT_MS % 1000) * 1000 };
	redisContext *c = a->port ? redisConnectWithTimeout(a->host, a->port, tv)
				  : redisConnectUnixWithTimeout(a->host, tv);
	if (!c)
		return NULL;
	if (c->err || redisSetTimeout(c, tv) != REDIS_OK) {
		redisFree(c);
		return NULL;
	}
	return c;
}

/* AUTH and SELECT on a new connection: 0 or -1 (why in err). */
static int setup(struct rov *o, redisContext *c, char *err, size_t errlen)
{
	struct rstore *st = o->st;
	if (st->password) {
		const char *argv[3] = { "AUTH", st->user ? st->user : st->password, st->password };
		size_t len[3] = { 4, strlen(argv[1]), strlen(st->password) };
		redisReply *r = redisCommandArgv(c, st->user ? 3 : 2, argv, len);
		bool ok = r && r->type != REDIS_REPLY_ERROR;
		if (r)
			freeReplyObject(r);
		if (!ok) {
			fmt_fixed(err, errlen, "AUTH refused");
			return -1;
		}
	}
	if (!st->cluster && st->conf.db) {
		redisReply *r = redisCommand(c, "SELECT %u", st->conf.db);
		bool ok = r && r->type != REDIS_REPLY_ERROR;
		if (r)
			freeReplyObject(r);
		if (!ok) {
			fmt_fixed(err, errlen, "SELECT %u refused", st->conf.db);
			return -1;
		}
	}
	return 0;
}

/* Where the master is, by the sentinels: 0 and *ret, or -1. */
static int ask_sentinels(struct rov *o, struct addr *ret)
{
	struct rstore *st = o->st;
	for (size_t i = 0; i < st->nsentinels; i++) {
		redisContext *c = connect_addr(&st->sentinels[i]);
		if (!c)
			continue;
		redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name %s",
					     st->master_name);
		int rc = -1;
		if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
		    r->element[0]->type == REDIS_REPLY_STRING &&
		    r->element[1]->type == REDIS_REPLY_STRING) {
			char text[300];
			const char *host = r->element[0]->str;
			fmt_fixed(text, sizeof(text), strchr(host, ':') ? "[%s]:%s" : "%s:%s", host,
				  r->element[1]->str);
			char err[100];
			if (redis_addr_parse(text, ret, err, sizeof(err)) == 0)
				rc = 0;
		}
		if (r)
			freeReplyObject(r);
		redisFree(c);
		if (rc == 0)
			return 0;
	}
	return -1;
}

/* A usable connection (o->c), made now if there is none: 0 or -1 (why in err). */
static int ensure_conn(struct rov *o, char *err, size_t errlen)
{
	if (o->c)
		return 0;
	struct rstore *st = o->st;
	struct addr cand[REDIS_MAX_NODES];
	size_t ncand = 0;
	if (st->cluster) {
		/* the master of the {ov} slot, if a MOVED named it, then the seeds */
		if (o->at.host[0])
			cand[ncand++] = o->at;
		for (size_t i = 0; i < st->nseeds && ncand < ARRAY_SIZE(cand); i++)
			cand[ncand++] = st->seeds[i];
	} else if (st->nsentinels) {
		if (ask_sentinels(o, &cand[0]) < 0) {
			fmt_fixed(err, errlen, "no sentinel named the master '%s'", st->master_name);
			return -1;
		}
		ncand = 1;
	} else {
		cand[ncand++] = st->server_addr;
	}
	fmt_fixed(err, errlen, "cannot connect");
	for (size_t i = 0; i < ncand; i++) {
		redisContext *c = connect_addr(&cand[i]);
		if (!c)
			continue;
		if (setup(o, c, err, errlen) < 0) {
			redisFree(c);
			continue;
		}
		o->c = c;
		o->at = cand[i];
		return 0;
	}
	return -1;
}

/*
 * Run a script on the connection (EVAL: these are rare calls), following one MOVED.
 * The reply (caller frees), or NULL with err (the connection is then dropped).
 */
static redisReply *run_script(struct rov *o, enum script_id sc, size_t nargs,
			      const char *const *args, const size_t *lens, char *err,
			      size_t errlen)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		if (ensure_conn(o, err, errlen) < 0)
			return NULL;
		const char *argv[8];
		size_t len[8];
		argv[0] = "EVAL";
		len[0] = 4;
		argv[1] = redis_scripts[sc].text;
		len[1] = redis_scripts[sc].len;
		argv[2] = "2";
		len[2] = 1;
		argv[3] = o->h_key;
		len[3] = strlen(o->h_key);
		argv[4] = o->v_key;
		len[4] = strlen(o->v_key);
		for (size_t i = 0; i < nargs && i < 3; i++) {
			argv[5 + i] = args[i];
			len[5 + i] = lens[i];
		}
		redisReply *r = redisCommandArgv(o->c, (int)(5 + nargs), argv, len);
		if (!r) {
			/* the command may have gone out: its outcome is not known */
			o->unknown = true;
			fmt_fixed(err, errlen, "%s", o->c->errstr[0] ? o->c->errstr : "no reply");
			drop_conn(o);
			return NULL;
		}
		if (r->type == REDIS_REPLY_ERROR && r->str && strncmp(r->str, "READONLY", 8) == 0 &&
		    attempt == 0) {
			/* a master demoted since (Sentinel): ask again where the master is */
			freeReplyObject(r);
			drop_conn(o);
			continue;
		}
		if (r->type == REDIS_REPLY_ERROR && r->str && strncmp(r->str, "MOVED ", 6) == 0 &&
		    attempt == 0) {
			/* "MOVED SLOT HOST:PORT": the master of the slot; once */
			const char *sp = strchr(r->str + 6, ' ');
			struct addr a;
			char e2[100];
			if (sp && redis_addr_parse(sp + 1, &a, e2, sizeof(e2)) == 0) {
				freeReplyObject(r);
				drop_conn(o);
				o->at = a;
				continue;
			}
		}
		return r;
	}
	fmt_fixed(err, errlen, "redirected more than once");
	return NULL;
}

/* ---- the thread --------------------------------------------------------------------- */

static void note_down(struct rov *o, const char *why)
{
	if (o->down_logged)
		return;
	o->down_logged = true;
	char msg[300];
	fmt_fixed(msg, sizeof(msg), "redis store: run-time limits cannot be read from Redis "
		  "(%s); this node keeps the ones it has", why);
	ov_log(o, true, msg);
}

static void note_up(struct rov *o)
{
	if (!o->down_logged)
		return;
	o->down_logged = false;
	ov_log(o, false, "redis store: run-time limits are read from Redis again");
}

/* Read the version; when it changed, the whole table. */
static void poll_once(struct rov *o)
{
	char err[160];
	if (ensure_conn(o, err, sizeof(err)) < 0) {
		note_down(o, err);
		return;
	}
	redisReply *r = redisCommand(o->c, "GET %s", o->v_key);
	if (!r) {
		note_down(o, o->c->errstr[0] ? o->c->errstr : "no reply");
		drop_conn(o);
		return;
	}
	uint64_t v = 0;
	bool moved = r->type == REDIS_REPLY_ERROR && r->str && strncmp(r->str, "MOVED ", 6) == 0;
	bool ok = r->type == REDIS_REPLY_NIL ||
		  (r->type == REDIS_REPLY_STRING && parse_u64(r->str, (size_t)r->len, &v) == 0);
	freeReplyObject(r);
	if (!ok && !moved) {
		note_down(o, "a bad version");
		return;
	}
	if (ok && o->have_version && v == o->version) {
		note_up(o);
		return;
	}
	r = run_script(o, SC_OV_READ, 0, NULL, NULL, err, sizeof(err));
	if (!r) {
		note_down(o, err);
		return;
	}
	struct store_ov_entry *e = NULL;
	size_t n = 0, skipped = 0;
	uint64_t version;
	int rc = store_redis_ov_parse(r, &version, &e, &n, &skipped);
	if (rc < 0) {
		freeReplyObject(r);
		note_down(o, rc == -ENOMEM ? "out of memory" : "a malformed reply");
		return;
	}
	/* an entry whose key_hash is not its (rule, key)'s under this store's seed was not
	 * written by a node of this prefix: it is skipped too */
	size_t k = 0;
	uint64_t now = realtime_ns();
	for (size_t i = 0; i < n; i++) {
		if (store_key_hash(o->s, e[i].rule, e[i].key) != e[i].key_hash) {
			skipped++;
			continue;
		}
		if (e[i].until_ns && e[i].until_ns <= now) {
			/* expired: drop it from Redis, unless it was set again meanwhile */
			char field[17], value[OV_VALUE_MAX + 1];
			fmt_fixed(field, sizeof(field), "%016" PRIx64, e[i].key_hash);
			int vl = redis_ov_format(&e[i], value, sizeof(value));
			if (vl > 0) {
				const char *args[2] = { field, value };
				size_t lens[2] = { 16, (size_t)vl };
				redisReply *d = run_script(o, SC_OV_DEL, 2, args, lens, err,
							   sizeof(err));
				if (d)
					freeReplyObject(d);
			}
			continue;
		}
		e[k++] = e[i];
	}
	if (skipped && !o->skip_logged) {
		o->skip_logged = true;
		char msg[200];
		fmt_fixed(msg, sizeof(msg), "redis store: %zu run-time limits in Redis were "
			  "skipped (malformed, or past %u entries)", skipped, STORE_OV_MAX);
		ov_log(o, true, msg);
	}
	rc = store_ov_replace(o->s->ov, e, k, now);
	free(e);
	freeReplyObject(r);
	if (rc < 0) {
		note_down(o, "the table could not be replaced");
		return;
	}
	o->version = version;
	o->have_version = true;
	note_up(o);
}

/* One change: run its script, then apply it here.  The result for done(). */
static int change_once(struct rov *o, struct store_ov_call *c)
{
	char field[17], value[OV_VALUE_MAX + 1], max[24];
	fmt_fixed(field, sizeof(field), "%016" PRIx64, c->e.key_hash);
	redisReply *r;
	c->err[0] = '\0';
	o->unknown = false;
	/* a connection that died since the last poll fails at once here, before the change
	 * goes out: then it is known that nothing was sent */
	if (o->c) {
		redisReply *ping = redisCommand(o->c, "PING");
		if (!ping)
			drop_conn(o);
		freeReplyObject(ping);
	}
	if (c->unset) {
		const char *args[1] = { field };
		size_t lens[1] = { 16 };
		r = run_script(o, SC_OV_DEL, 1, args, lens, c->err, sizeof(c->err));
	} else {
		int vl = redis_ov_format(&c->e, value, sizeof(value));
		if (vl < 0)
			return -EINVAL;
		fmt_fixed(max, sizeof(max), "%u", STORE_OV_MAX);
		const char *args[3] = { field, value, max };
		size_t lens[3] = { 16, (size_t)vl, strlen(max) };
		r = run_script(o, SC_OV_SET, 3, args, lens, c->err, sizeof(c->err));
	}
	if (!r) {
		char why[200], what[120];
		fmt_fixed(what, sizeof(what), "%s", c->err);
		fmt_fixed(why, sizeof(why), "Redis unreachable (%s)", what);
		note_down(o, why);
		if (o->unknown)
			fmt_fixed(c->err, sizeof(c->err), "no answer from Redis (%s): the change "
				  "may or may not have been made; `sluice limits overrides` shows "
				  "what holds (within a second)", what);
		else
			fmt_fixed(c->err, sizeof(c->err), "%s", why);
		return o->unknown ? -ETIMEDOUT : -EAGAIN;
	}
	int rc;
	if (r->type == REDIS_REPLY_ERROR) {
		bool full = r->str && strstr(r->str, "FULL") != NULL;
		fmt_fixed(c->err, sizeof(c->err), "Redis refused it: %.120s", r->str ? r->str : "");
		rc = full ? -E2BIG : -EPROTO;
	} else if (r->type != REDIS_REPLY_INTEGER) {
		fmt_fixed(c->err, sizeof(c->err), "a bad reply from Redis");
		rc = -EPROTO;
	} else {
		/* Redis took it: this node's table now, the others' within a poll */
		uint64_t now = realtime_ns();
		if (c->unset) {
			rc = r->integer > 0;
			store_ov_del(o->s->ov, c->e.key_hash, now);
		} else {
			rc = store_ov_put(o->s->ov, &c->e, now);
			if (rc == -E2BIG)
				rc = 0; /* Redis holds it; the next poll reads what it can */
		}
		/* the version moved: read the table again at the next poll (other nodes'
		 * changes may have come between) */
		o->have_version = false;
	}
	freeReplyObject(r);
	return rc;
}

static void *ov_thread(void *arg)
{
	struct rov *o = arg;
	uint64_t next_poll = 0;
	pthread_mutex_lock(&o->lock);
	while (!o->stop) {
		struct store_ov_call *q = o->q_head;
		o->q_head = o->q_tail = NULL;
		pthread_mutex_unlock(&o->lock);
		while (q) {
			struct store_ov_call *c = q;
			q = c->next;
			c->next = NULL;
			int rc = change_once(o, c);
			c->done(c, rc);
		}
		uint64_t now = now_ns();
		if (now >= next_poll) {
			poll_once(o);
			next_poll = now_ns() + OV_POLL_MS * 1000000ULL;
		}
		pthread_mutex_lock(&o->lock);
		if (o->stop || o->q_head)
			continue;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t wait = next_poll > now_ns() ? next_poll - now_ns() : 0;
		ts.tv_sec += (time_t)(wait / 1000000000ULL);
		ts.tv_nsec += (long)(wait % 1000000000ULL);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&o->cond, &o->lock, &ts);
	}
	/* stopping: the changes still queued are answered, not made */
	struct store_ov_call *q = o->q_head;
	o->q_head = o->q_tail = NULL;
	pthread_mutex_unlock(&o->lock);
	while (q) {
		struct store_ov_call *c = q;
		q = c->next;
		fmt_fixed(c->err, sizeof(c->err), "sluiced is stopping");
		c->done(c, -ECANCELED);
	}
	drop_conn(o);
	return NULL;
}

struct rov *redis_ov_start(struct rstore *st, struct store *s, char *err, size_t errlen)
{
	struct rov *o = calloc(1, sizeof(*o));
	if (!o) {
		fmt_fixed(err, errlen, "out of memory");
		return NULL;
	}
	o->st = st;
	o->s = s;
	fmt_fixed(o->h_key, sizeof(o->h_key), "%s{ov}", st->prefix);
	fmt_fixed(o->v_key, sizeof(o->v_key), "%s{ov}:v", st->prefix);
	pthread_mutex_init(&o->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&o->cond, &ca);
	pthread_condattr_destroy(&ca);
	int rc = pthread_create(&o->thread, NULL, ov_thread, o);
	if (rc != 0) {
		fmt_fixed(err, errlen, "cannot start the run-time limits thread: %s", strerror(rc));
		pthread_cond_destroy(&o->cond);
		pthread_mutex_destroy(&o->lock);
		free(o);
		return NULL;
	}
	o->started = true;
	return o;
}

void redis_ov_ensure(struct rstore *st)
{
	if (atomic_load(&st->ov_sync) || st->ov_failed || !st->self)
		return;
	char err[200];
	struct rov *o = redis_ov_start(st, st->self, err, sizeof(err));
	if (!o) {
		st->ov_failed = true;
		ov_log(&(struct rov){ .st = st }, true, err);
		return;
	}
	atomic_store(&st->ov_sync, o);
}

void redis_ov_stop(struct rov *o)
{
	if (!o)
		return;
	pthread_mutex_lock(&o->lock);
	o->stop = true;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->lock);
	if (o->started)
		pthread_join(o->thread, NULL);
	pthread_cond_destroy(&o->cond);
	pthread_mutex_destroy(&o->lock);
	free(o);
}

int redis_ov_change(void *ctx, struct store_ov_call *c)
{
	struct rstore *st = ctx;
	struct rov *o = atomic_load(&st->ov_sync);
	if (!o || !c->done) {
		fmt_fixed(c->err, sizeof(c->err), "the run-time limits' thread is not running");
		return -EAGAIN;
	}
	c->next = NULL;
	pthread_mutex_lock(&o->lock);
	if (o->stop) {
		pthread_mutex_unlock(&o->lock);
		return -ECANCELED;
	}
	if (o->q_tail)
		o->q_tail->next = c;
	else
		o->q_head = c;
	o->q_tail = c;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->lock);
	return STORE_PENDING;
}
