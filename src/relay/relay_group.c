/*
 * relay_group -- lanes that several recipient domains share (`lanes = "provider"` and
 * `lanes = "mx"` on an mx route, doc/RELAY.md "Provider lanes").
 *
 * A recipient goes first to its domain's lane (ROUTE:DOMAIN), which looks up the MX
 * hosts.  When the answer comes (once per answer, never per recipient: law 8) it is
 * matched against the providers' patterns, or made into the set of MX host names; a
 * match makes the domain's lane forward to the group's lane (ROUTE:provider:NAME or
 * ROUTE:mx:HOSTS), and the mail it holds moves into the group's lane.  While
 * the answer is used (its DNS TTL within relay.dns_min_ttl and dns_max_ttl:
 * targets_until) new mail for the domain goes straight there; then the domain is looked
 * up again.  The group lane has its own budget, history and
 * suspensions like any lane: one budget for all its domains, and a provider's throttling
 * suspends the group's lane and bounces nobody (law 5).
 *
 * A group lane that loses its own answer (its domain is gone, or left the group) sends
 * every member back to its domain's lane with its mail, to be looked up and grouped
 * again.  Under DANE, a group one of whose members had a validated MX answer uses DANE
 * for all its mail (group_take_answer).
 *
 * Invariants: a lane forwards to a group lane only (never a chain); a group lane lists
 * the lanes that forward to it and is not freed while it has any; a reload drops every
 * forward (each domain is grouped again under the new configuration).
 *
 * Runs on the relay's thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include "relay_int.h"
#include "util.h"

/* ---- forwards ---- */

static bool targets_fresh(const struct lane *l, uint64_t now)
{
	return l->ntargets && now < l->targets_until;
}

bool group_keeps(const struct lane *l, uint64_t now)
{
	return l->nmembers > 0 || (l->fwd && targets_fresh(l, now));
}

void group_unforward(struct lane *l)
{
	struct lane *g = l->fwd;
	if (!g)
		return;
	TAILQ_REMOVE(&g->members, l, member);
	g->nmembers--;
	l->fwd = NULL;
	/* looked up again before it sends: the answer may put it in a group again */
	free(l->targets);
	l->targets = NULL;
	l->ntargets = 0;
}

void group_leave(struct lane *l)
{
	group_unforward(l);
	struct lane *m;
	while ((m = TAILQ_FIRST(&l->members)))
		group_unforward(m);
}

static int cmp_host(const void *a, const void *b)
{
	return strcasecmp(*(const char *const *)a, *(const char *const *)b);
}

/* "ROUTE:mx:a.example,b.example": the distinct MX host names of an answer (those with an
 * address in it), sorted; a long set is cut and told apart by a hash of the whole. */
static void mx_set_name(const char *route, const struct mx_target *t, size_t nt, char *out,
			size_t len)
{
	const char *h[MX_MAX_TARGETS];
	size_t n = 0;
	for (size_t i = 0; i < nt && n < MX_MAX_TARGETS; i++)
		h[n++] = t[i].host;
	qsort(h, n, sizeof(*h), cmp_host);
	char set[MX_MAX_TARGETS * 256 + 1];
	size_t o = 0;
	set[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		if (i && strcasecmp(h[i], h[i - 1]) == 0)
			continue;
		int w = snprintf(set + o, sizeof(set) - o, "%s%s", o ? "," : "", h[i]);
		if (w < 0 || (size_t)w >= sizeof(set) - o)
			break;
		o += (size_t)w;
	}
	for (char *p = set; *p; p++)
		if (*p >= 'A' && *p <= 'Z')
			*p = (char)(*p - 'A' + 'a');
	if (o <= 200) {
		snprintf(out, len, "%s:mx:%.200s", route, set);
		return;
	}
	/* the basis is a digit short of FNV's own: kept, because these names are in
	 * relay.lanes, and a new name would start the set's send history again */
	uint64_t hash = fnv1a64_str(UINT64_C(1469598103934665603), set);
	snprintf(out, len, "%s:mx:%.150s~%016" PRIx64, route, set, hash);
}

/* The provider of an answer: the first that claims one of its hosts, the most preferred
 * first. */
static const struct provider_conf *answer_provider(const struct relay *r,
						   const struct mx_target *t, size_t n)
{
	const struct provider_conf *p = NULL;
	for (size_t i = 0; i < n && !p; i++)
		p = relay_conf_provider(&r->crt->conf, t[i].host);
	return p;
}

/* Was the answer DNSSEC-validated, where DANE needs it (tls = "dane" or "dane-only")? */
static bool answer_dnssec(const struct route_conf *rc, const struct mx_target *t, size_t n)
{
	if (rc->tls != SMTP_TLS_DANE && rc->tls != SMTP_TLS_DANE_ONLY)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!t[i].secure)
			return false;
	return n > 0;
}

/* The name of the group lane an answer puts a domain of route rc in, and its provider
 * (NULL for lanes = "mx"); false when it is no provider's (lanes = "provider"). */
static bool group_name(const struct relay *r, const struct route_conf *rc,
		       const struct mx_target *t, size_t n, char *name, size_t len,
		       const struct provider_conf **ret_p)
{
	*ret_p = NULL;
	if (rc->lanes == ROUTE_LANES_PROVIDER) {
		const struct provider_conf *p = answer_provider(r, t, n);
		if (!p)
			return false;
		snprintf(name, len, "%s:provider:%s", rc->name, p->name);
		*ret_p = p;
	} else {
		mx_set_name(rc->name, t, n, name, len);
	}
	return true;
}

bool group_matches(const struct lane *l, const struct mx_target *t, size_t n)
{
	if (!l->rt)
		return false;
	char name[620];
	const struct provider_conf *p;
	return group_name(l->r, l->rt->conf, t, n, name, sizeof(name), &p) &&
	       strcmp(name, l->name) == 0;
}

/* The group lane takes the answer l just got: the hosts it connects to, and the domain
 * it looks up when the answer is too old. */
static void group_take_answer(struct lane *g, const struct lane *l)
{
	struct mx_target *copy = calloc(l->ntargets, sizeof(*copy));
	char *dom = strdup(l->domain);
	if (!copy || !dom) {
		free(copy);
		free(dom);
		return; /* XXX the group keeps its older answer */
	}
	memcpy(copy, l->targets, l->ntargets * sizeof(*copy));
	/* Under DANE, once one member's answer was validated the group's hosts are DANE's
	 * for all its mail (dnssec_seen): the hosts of a group are the same names (lanes =
	 * "mx") or names the operator's provider patterns vouch for, as a smarthost's name
	 * is, so a validated TLSA of theirs binds whatever member's answer the group uses
	 * now -- a signed domain's mail never goes with less than DANE because an unsigned
	 * domain's answer came last, and the group keeps one budget (RFC 7672 2.2 asks a
	 * validated MX answer to trust the names in it). */
	if (answer_dnssec(l->rt->conf, l->targets, l->ntargets))
		g->dnssec_seen = true;
	if (g->dnssec_seen)
		for (size_t i = 0; i < l->ntargets; i++)
			copy[i].secure = true;
	free(g->targets);
	g->targets = copy;
	g->ntargets = l->ntargets;
	g->targets_until = l->targets_until;
	g->next_target = 0;
	free(g->domain);
	g->domain = dom;
}

/* The messages with an item in l (NULL with *ret_n > 0: out of memory, logged): a
 * copy, as moving them changes l's list. */
static struct rmsg **lane_msgs(struct lane *l, size_t *ret_n)
{
	size_t n = 0, k = 0;
	struct lane_item *it;
	TAILQ_FOREACH(it, &l->items, link)
		n++;
	*ret_n = n;
	struct rmsg **ms = n ? calloc(n, sizeof(*ms)) : NULL;
	if (n && !ms) {
		base_logf(l->r, LOG_LEVEL_ERROR, "lane=%s its mail cannot move: out of memory",
			  l->name);
		return NULL;
	}
	TAILQ_FOREACH(it, &l->items, link)
		ms[k++] = it->m;
	return ms;
}

bool group_join(struct lane *l)
{
	struct relay *r = l->r;
	const struct route_conf *rc = l->rt->conf;
	const struct provider_conf *p;
	char name[620];
	if (!group_name(r, rc, l->targets, l->ntargets, name, sizeof(name), &p))
		return false; /* not a provider's: the domain keeps its own lane */
	struct lane *g = lane_find(r, name);
	if (g && !g->group)
		return false; /* cannot be: names of groups are not domains' */
	if (!g) {
		g = lane_make(r, l->rt, name, l->domain, p);
		if (!g) {
			base_logf(r, LOG_LEVEL_ERROR, "lane=%s cannot join lane %s: out of memory or "
				  "too many lanes; it keeps its own", l->name, name);
			return false;
		}
		g->group = true;
	}
	group_take_answer(g, l);
	if (l->fwd) {
		TAILQ_REMOVE(&l->fwd->members, l, member);
		l->fwd->nmembers--;
	}
	l->fwd = g;
	TAILQ_INSERT_TAIL(&g->members, l, member);
	g->nmembers++;
	base_logf(r, LOG_LEVEL_INFO, "lane=%s joins lane %s (%zu domain(s))", l->name, g->name,
		  g->nmembers);
	/* its mail goes to the group: each of its messages' items in l moves (only that item:
	 * a message's other lanes stay as they are, law 8) */
	size_t n;
	struct rmsg **ms = lane_msgs(l, &n);
	if (n && !ms) {
		/* XXX its mail waits here for the next reload; new mail goes to the group */
		lane_kick(g);
		return true;
	}
	for (size_t i = 0; i < n; i++)
		msg_move_lane(r, ms[i], l, g);
	free(ms);
	conn_close_idle(l);
	lane_kick(g);
	return true;
}

void group_lost(struct lane *l, const char *text)
{
	struct relay *r = l->r;
	/* the group's answer is gone (the domain it used left, or no longer exists): every
	 * domain is looked up again, its mail with it, and each goes where its own answer
	 * says (back here if it still matches).  Once per lost answer, not per answer. */
	base_logf(r, LOG_LEVEL_NOTICE, "lane=%s %s: its %zu domain(s) are looked up again",
		  l->name, text, l->nmembers);
	struct lane *m;
	while ((m = TAILQ_FIRST(&l->members)))
		group_unforward(m);
	l->dnssec_seen = false;
	free(l->targets);
	l->targets = NULL;
	l->ntargets = 0;
	size_t n;
	struct rmsg **ms = lane_msgs(l, &n);
	if (n && !ms) {
		/* XXX its mail waits for the next reload (the group looks its domain up again) */
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = -1,
					      .signal = "dns" };
		lane_signal(l, &cr, text);
		lane_kick(l);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (msg_route(r, ms[i]) < 0)
			base_logf(r, LOG_LEVEL_ERROR, "qid=%s cannot be routed: out of memory",
				  ms[i]->id);
		lane_kick_msg(ms[i]);
	}
	free(ms);
	conn_close_idle(l);
}

/* ---- `sluice lanes` ---- */

void group_view(const struct lane *l, bool json, struct buf *b)
{
	const size_t max = json ? 1000 : 20;
	if (l->group) {
		if (json) {
			buf_append_cstr(b, ", \"provider\": ");
			buf_append_json_string(b, l->provider_name ? l->provider_name : "");
			buf_printf(b, ", \"ndomains\": %zu, \"domains\": [", l->nmembers);
		} else {
			buf_printf(b, "  carries      %zu domain(s):", l->nmembers);
		}
		size_t k = 0;
		const struct lane *m;
		TAILQ_FOREACH(m, &l->members, member) {
			if (k == max)
				break;
			if (json) {
				buf_append_cstr(b, k ? ", " : "");
				buf_append_json_string(b, m->domain);
			} else {
				buf_printf(b, "%s %s", k ? "," : "", m->domain);
			}
			k++;
		}
		if (json)
			buf_append_cstr(b, "]");
		else
			buf_printf(b, k < l->nmembers ? " and %zu more\n" : "\n", l->nmembers - k);
	} else if (l->fwd && json) {
		buf_append_cstr(b, ", \"forwards_to\": ");
		buf_append_json_string(b, l->fwd->name);
	} else if (l->fwd) {
		buf_printf(b, "  forwards to  %s\n", l->fwd->name);
	}
}
