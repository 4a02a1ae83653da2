/*
 * queue_select -- selections and the summary's counts (queue_select.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <xxhash.h>

#include "queue_select.h"
#include "queue_table.h"

static const char *const state_names[] = {
	[QUEUE_SEL_ANY] = "any",		[QUEUE_SEL_DEFERRED] = "deferred",
	[QUEUE_SEL_TODO] = "todo",		[QUEUE_SEL_HELD] = "held",
	[QUEUE_SEL_UNCERTAIN] = "uncertain",
};

int queue_select_state_parse(const char *s, enum queue_select_state *ret)
{
	for (size_t i = 0; i < sizeof(state_names) / sizeof(state_names[0]); i++)
		if (strcmp(s, state_names[i]) == 0) {
			*ret = (enum queue_select_state)i;
			return 0;
		}
	return -EINVAL;
}

const char *queue_select_state_name(enum queue_select_state s)
{
	return (unsigned)s < sizeof(state_names) / sizeof(state_names[0]) ? state_names[s] : "?";
}

bool queue_select_any(const struct queue_select *s)
{
	return s->ids || s->sender || s->domain || s->older_us || s->state != QUEUE_SEL_ANY;
}

static int id_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

bool queue_select_has_id(const struct queue_select *s, const char *id)
{
	return bsearch(id, s->ids, s->nids, sizeof(s->ids[0]), id_cmp) != NULL;
}

const char *queue_addr_domain(const char *addr)
{
	const char *at = strrchr(addr, '@');
	return at ? at + 1 : "";
}

bool queue_select_domain_match(const char *pattern, const char *addr)
{
	const char *d = queue_addr_domain(addr);
	if (pattern[0] != '.')
		return strcasecmp(pattern, d) == 0;
	/* ".example.com": a subdomain, so d is longer and ends in the whole pattern */
	size_t pl = strlen(pattern), dl = strlen(d);
	return dl > pl && strcasecmp(d + dl - pl, pattern) == 0;
}

bool queue_select_sender_match(const char *pattern, const char *sender)
{
	if (!pattern[0] || strcmp(pattern, "<>") == 0)
		return !sender[0];
	if (pattern[0] == '@')
		return sender[0] && strchr(sender, '@') &&
		       strcasecmp(pattern + 1, queue_addr_domain(sender)) == 0;
	return strcasecmp(pattern, sender) == 0;
}

bool queue_select_rcpt_match(const struct queue_select *s, const struct qentry *e,
			     size_t i, uint64_t now_us)
{
	char st = qentry_status(e)[i];
	if (st != QUEUE_TODO && st != QUEUE_UNCERTAIN)
		return false;
	if (s->domain && !queue_select_domain_match(s->domain, qentry_addr(e, i)))
		return false;
	uint64_t next = qentry_rcpt(e)[i].next_us;
	switch (s->state) {
	case QUEUE_SEL_DEFERRED:
		return next > now_us;
	case QUEUE_SEL_TODO:
		return next <= now_us;
	case QUEUE_SEL_UNCERTAIN:
		return st == QUEUE_UNCERTAIN;
	case QUEUE_SEL_ANY:
	case QUEUE_SEL_HELD:
		break;
	}
	return true;
}

bool queue_select_match(const struct queue_select *s, const struct qentry *e,
			uint64_t now_us)
{
	if (s->ids && !queue_select_has_id(s, e->id))
		return false;
	if (s->sender && !queue_select_sender_match(s->sender, qentry_sender(e)))
		return false;
	if (s->older_us && (e->arrival_us > now_us || now_us - e->arrival_us < s->older_us))
		return false;
	if (s->state == QUEUE_SEL_HELD && e->control[QUEUE_CTL_HOLD] != 'H')
		return false;
	bool per_rcpt = s->domain || (s->state != QUEUE_SEL_ANY && s->state != QUEUE_SEL_HELD);
	if (!per_rcpt)
		return true;
	for (size_t i = 0; i < e->nrcpt; i++)
		if (queue_select_rcpt_match(s, e, i, now_us))
			return true;
	return false;
}

/* ---- the summary ---- */

unsigned queue_summary_bucket(uint64_t age_us)
{
	uint64_t limit = UINT64_C(5) * 60 * 1000000;
	for (unsigned b = 0; b < QUEUE_SUMMARY_BUCKETS - 1; b++, limit *= 2)
		if (age_us < limit)
			return b;
	return QUEUE_SUMMARY_BUCKETS - 1;
}

const char *queue_summary_bucket_name(unsigned b)
{
	static const char *const names[QUEUE_SUMMARY_BUCKETS] = {
		"5m", "10m", "20m", "40m", "80m", "160m", "320m", "640m", "1280m", "1280m+",
	};
	return b < QUEUE_SUMMARY_BUCKETS ? names[b] : "?";
}

void queue_summary_init(struct queue_summary *s)
{
	memset(s, 0, sizeof(*s));
}

void queue_summary_clear(struct queue_summary *s)
{
	for (size_t i = 0; i < s->cap; i++)
		free(s->rows[i].key);
	free(s->rows);
	queue_summary_init(s);
}

static uint64_t key_hash(const char *key, size_t len)
{
	char low[256];
	if (len > sizeof(low))
		len = sizeof(low); /* the rest still counts in the comparison */
	for (size_t i = 0; i < len; i++)
		low[i] = (char)(key[i] >= 'A' && key[i] <= 'Z' ? key[i] + 32 : key[i]);
	return XXH64(low, len, 0);
}

static int grow(struct queue_summary *s)
{
	size_t cap = s->cap ? s->cap * 2 : 64;
	struct queue_summary_row *rows = calloc(cap, sizeof(*rows));
	if (!rows)
		return -ENOMEM;
	for (size_t i = 0; i < s->cap; i++) {
		if (!s->rows[i].key)
			continue;
		size_t j = key_hash(s->rows[i].key, strlen(s->rows[i].key)) & (cap - 1);
		while (rows[j].key)
			j = (j + 1) & (cap - 1);
		rows[j] = s->rows[i];
	}
	free(s->rows);
	s->rows = rows;
	s->cap = cap;
	return 0;
}

static void count(struct queue_summary_row *r, unsigned b)
{
	r->total++;
	r->count[b]++;
}

int queue_summary_add(struct queue_summary *s, const char *key, uint64_t age_us)
{
	unsigned b = queue_summary_bucket(age_us);
	count(&s->total, b);
	if ((s->n + 1) * 4 > s->cap * 3 && grow(s) < 0)
		return -ENOMEM;
	size_t len = strlen(key);
	size_t j = key_hash(key, len) & (s->cap - 1);
	while (s->rows[j].key && strcasecmp(s->rows[j].key, key) != 0)
		j = (j + 1) & (s->cap - 1);
	struct queue_summary_row *r = &s->rows[j];
	if (!r->key) {
		char *k = malloc(len + 1);
		if (!k)
			return -ENOMEM;
		for (size_t i = 0; i <= len; i++)
			k[i] = (char)(key[i] >= 'A' && key[i] <= 'Z' ? key[i] + 32 : key[i]);
		r->key = k;
		s->n++;
	}
	count(r, b);
	return 0;
}

static int row_cmp(const void *a, const void *b)
{
	const struct queue_summary_row *x = *(const struct queue_summary_row *const *)a;
	const struct queue_summary_row *y = *(const struct queue_summary_row *const *)b;
	if (x->total != y->total)
		return x->total > y->total ? -1 : 1;
	return strcmp(x->key, y->key);
}

int queue_summary_top(const struct queue_summary *s, size_t max,
		      const struct queue_summary_row ***ret, size_t *ret_n)
{
	const struct queue_summary_row **v = malloc((s->n ? s->n : 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	size_t n = 0;
	for (size_t i = 0; i < s->cap; i++)
		if (s->rows[i].key)
			v[n++] = &s->rows[i];
	qsort(v, n, sizeof(*v), row_cmp);
	*ret = v;
	*ret_n = n < max ? n : max;
	return 0;
}
