/*
 * policy_overrides -- the overrides files' tables: read at load, re-read when a file
 * changes, looked up by workers for every decision (see policy_int.h).
 *
 * Invariant: a rule's table (r->ov) is read only inside an ebr_enter() ... ebr_exit()
 * section, and nothing read from it -- no pointer into it -- outlives the section
 * (policy_rule_limits() copies the limits out).  A table swapped out by
 * policy_reload_overrides() is ebr_retire()d, never freed directly, so it is freed only
 * once no section that could have loaded it is still running, however close together
 * two swaps come.  The one table freed directly is the current one, by
 * policy_overrides_clear() when the rule set is freed: its last reference is gone, so no
 * reader is left; the tables retired before belong to the reclamation list alone.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ebr.h"
#include "policy_int.h"

/* rate_overrides_free() with the type ebr_retire() takes */
static void overrides_free(void *o)
{
	rate_overrides_free(o);
}

int policy_overrides_load(struct policy_rule *r, char *err, size_t errlen)
{
	struct rate_overrides *o;
	struct selector_set set = rule_selectors(r);
	/* stat before reading: a change made while the file is read must show as a change
	 * at the next check (see policy_reload_overrides) */
	struct stat st;
	if (stat(r->ov_path, &st) < 0)
		memset(&st, 0, sizeof(st));
	int rc = rate_overrides_load(r->ov_path, selector_normalize_key, &set, &o, err, errlen);
	if (rc < 0)
		return rc;
	r->ov_st = st;
	atomic_store(&r->ov, o);
	return 0;
}

void policy_overrides_clear(struct policy_rule *r)
{
	rate_overrides_free(atomic_load(&r->ov));
	atomic_store(&r->ov, NULL);
}

int policy_reload_overrides(struct policy *p, struct buf *err)
{
	int reloaded = 0;
	for (size_t i = 0; i < p->nrules; i++) {
		struct policy_rule *r = &p->rules[i];
		struct stat st;
		if (!r->ov_path)
			continue;
		if (stat(r->ov_path, &st) < 0) {
			memset(&st, 0, sizeof(st));
			if (r->ov_st.st_ino == 0)
				continue; /* still missing: reported once, when it went */
		} else if (st.st_mtim.tv_sec == r->ov_st.st_mtim.tv_sec &&
			 st.st_mtim.tv_nsec == r->ov_st.st_mtim.tv_nsec &&
			 st.st_size == r->ov_st.st_size && st.st_ino == r->ov_st.st_ino)
			continue;
		struct rate_overrides *o;
		struct selector_set set = rule_selectors(r);
		char msg[400];
		if (rate_overrides_load(r->ov_path, selector_normalize_key, &set, &o, msg,
					sizeof(msg)) < 0) {
			/* keep the table in use; report once per change of the file.  The stat
			 * is the one taken before reading: a file rewritten while it was read
			 * (truncated, then written) is read again at the next check, instead of
			 * its new mtime being recorded against the half-written content */
			r->ov_st = st;
			buf_printf(err, "limit \"%s\": %s (keeping the previous overrides)\n",
				   r->name, msg);
			continue;
		}
		r->ov_st = st;
		/* workers may be reading the old table right now: it goes when they are out
		 * (release, by the seq_cst exchange: the new table's contents are seen by a
		 * worker that loads its pointer) */
		ebr_retire(atomic_exchange(&r->ov, o), overrides_free);
		reloaded++;
	}
	/* this is the writer's periodic check: free what no reader can see any more (the
	 * tables retired just now too, if no worker was inside a lookup) */
	ebr_collect();
	return reloaded;
}

int policy_rule_limits(const struct policy_rule *r, struct str key, struct rate_limits *ret,
		       bool *ret_overridden)
{
	/* the lookup and the copy inside one section: the table may be retired meanwhile */
	ebr_enter();
	const struct rate_overrides *o = atomic_load_explicit(&r->ov, memory_order_acquire);
	const struct rate_limits *l = o ? rate_overrides_find(o, key) : NULL;
	bool overridden = l != NULL;
	struct rate_limits lim = l ? *l : r->limits;
	ebr_exit();
	if (ret_overridden)
		*ret_overridden = overridden;
	if (overridden && lim.n == 0)
		return 0; /* the key's override is 0: unlimited */
	*ret = lim;
	return 1;
}

size_t policy_rule_overrides_count(const struct policy_rule *r, const char **ret_path)
{
	if (ret_path)
		*ret_path = r->ov_path;
	ebr_enter();
	const struct rate_overrides *o = atomic_load_explicit(&r->ov, memory_order_acquire);
	size_t n = o ? rate_overrides_count(o) : 0;
	ebr_exit();
	return n;
}
