/*
 * policy_overrides -- the overrides files' tables: read at load, re-read when a file
 * changes, looked up by workers for every decision (see policy_int.h).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "policy_int.h"

int policy_overrides_load(struct policy_rule *r, char *err, size_t errlen)
{
	struct rate_overrides *o;
	struct selector_set set = { r->sel, r->nsel };
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
	rate_overrides_free(r->ov_retired);
	atomic_store(&r->ov, NULL);
	r->ov_retired = NULL;
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
		struct selector_set set = { r->sel, r->nsel };
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
		/*
		 * XXX workers read the table without a lock for the microseconds of one lookup
		 * (limits are copied out at once), so the table replaced here is freed only at
		 * the next swap, which the caller's check interval puts seconds away.
		 */
		rate_overrides_free(r->ov_retired);
		r->ov_retired = atomic_exchange(&r->ov, o);
		reloaded++;
	}
	return reloaded;
}

const struct rate_limits *policy_rule_limits(const struct policy_rule *r, struct str key,
					     bool *ret_overridden)
{
	const struct rate_overrides *o = atomic_load_explicit(&r->ov, memory_order_acquire);
	const struct rate_limits *l = o ? rate_overrides_find(o, key) : NULL;
	if (ret_overridden)
		*ret_overridden = l != NULL;
	if (!l)
		return &r->limits;
	return l->n ? l : NULL;
}
