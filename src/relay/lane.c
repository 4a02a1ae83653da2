/*
 * lane -- a lane's budget (lane.h): slides per window, adaptive factor, suspension.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "lane.h"

static uint64_t window_cap(uint64_t n)
{
	/* the ring must hold the configured N (the factor only ever lowers it) */
	return n > UINT32_MAX ? UINT32_MAX : n;
}

int lane_budget_init(struct lane_budget *b, const struct rate_limits *rate, uint64_t guard_ns)
{
	memset(b, 0, sizeof(*b));
	b->factor = LANE_FACTOR_FULL;
	return lane_budget_set_rate(b, rate, guard_ns);
}

int lane_budget_set_rate(struct lane_budget *b, const struct rate_limits *rate,
			 uint64_t guard_ns)
{
	struct slide nw[RATE_MAX_WINDOWS] = { 0 };
	for (unsigned i = 0; i < rate->n; i++) {
		int r = slide_init(&nw[i], (uint32_t)window_cap(rate->w[i].count));
		if (r < 0) {
			for (unsigned j = 0; j < i; j++)
				slide_done(&nw[j]);
			return r;
		}
	}
	/* Carry the history over: every remembered send of any old window goes into every
	 * new one (up to its capacity, the newest kept), so that a reload can never make
	 * room that the old windows had already used. */
	for (unsigned i = 0; i < rate->n; i++) {
		const struct slide *src = NULL;
		for (unsigned j = 0; j < b->rate.n; j++)
			if (!src || b->win[j].len > src->len)
				src = &b->win[j];
		if (!src)
			continue;
		uint32_t skip = src->len > nw[i].cap ? src->len - nw[i].cap : 0;
		for (uint32_t k = skip; k < src->len; k++) {
			uint64_t us = src->at[(src->head + k) % src->cap];
			nw[i].at[nw[i].len++] = us;
		}
	}
	for (unsigned j = 0; j < b->rate.n; j++)
		slide_done(&b->win[j]);
	memcpy(b->win, nw, sizeof(nw));
	b->rate = *rate;
	b->guard_ns = guard_ns;
	return 0;
}

void lane_budget_done(struct lane_budget *b)
{
	for (unsigned i = 0; i < RATE_MAX_WINDOWS; i++)
		slide_done(&b->win[i]);
	b->rate.n = 0;
}

uint64_t lane_budget_limit(const struct lane_budget *b, unsigned i)
{
	uint64_t n = b->rate.w[i].count;
	if (b->factor >= LANE_FACTOR_FULL)
		return n;
	uint64_t scaled = (n > UINT64_MAX / LANE_FACTOR_FULL ? n / LANE_FACTOR_FULL * b->factor : n * b->factor / LANE_FACTOR_FULL);
	return scaled ? scaled : 1;
}

uint64_t lane_budget_window(const struct lane_budget *b, unsigned i)
{
	return b->rate.w[i].period_ns + b->guard_ns;
}

uint64_t lane_budget_wait(const struct lane_budget *b, uint64_t now)
{
	uint64_t wait = 0;
	for (unsigned i = 0; i < b->rate.n; i++) {
		uint64_t w = 0;
		if (!slide_peek(&b->win[i], lane_budget_limit(b, i), lane_budget_window(b, i), now,
				&w) && w > wait)
			wait = w;
	}
	return wait;
}

uint64_t lane_budget_take(struct lane_budget *b, uint64_t want, uint64_t now,
			  uint64_t *ret_wait_ns)
{
	uint64_t got = 0;
	while (got < want) {
		uint64_t wait = lane_budget_wait(b, now);
		if (wait) {
			if (ret_wait_ns)
				*ret_wait_ns = wait;
			break;
		}
		for (unsigned i = 0; i < b->rate.n; i++) {
			bool ok = slide_take(&b->win[i], lane_budget_limit(b, i),
					     lane_budget_window(b, i), now, NULL);
			(void)ok; /* admitted: the peek above said so, and nothing ran between */
		}
		got++;
		b->sends++;
	}
	if (got == want && ret_wait_ns)
		*ret_wait_ns = 0;
	return got;
}

void lane_budget_remember(struct lane_budget *b, uint64_t t)
{
	for (unsigned i = 0; i < b->rate.n; i++)
		slide_remember(&b->win[i], lane_budget_window(b, i), t);
}

void lane_budget_restamp(struct lane_budget *b, uint64_t from, uint64_t to)
{
	for (unsigned i = 0; i < b->rate.n; i++)
		slide_restamp(&b->win[i], from, to);
}

uint64_t lane_budget_used(const struct lane_budget *b, unsigned i, uint64_t now)
{
	return i < b->rate.n ? slide_count(&b->win[i], lane_budget_window(b, i), now) : 0;
}

void lane_budget_slow(struct lane_budget *b)
{
	b->factor /= 2;
	if (b->factor < LANE_FACTOR_MIN)
		b->factor = LANE_FACTOR_MIN;
	b->successes = 0;
}

void lane_budget_success(struct lane_budget *b)
{
	b->level = 0;
	if (b->factor >= LANE_FACTOR_FULL)
		return;
	uint64_t run = b->rate.n ? lane_budget_limit(b, 0) : 1;
	if (++b->successes < run)
		return;
	b->successes = 0;
	uint32_t f = b->factor + LANE_FACTOR_FULL / 4;
	b->factor = f > LANE_FACTOR_FULL ? LANE_FACTOR_FULL : f;
}

uint64_t lane_budget_suspend(struct lane_budget *b, uint64_t now, int64_t for_ns,
			     uint64_t min_ns, uint64_t max_ns, const char *why)
{
	uint64_t len;
	if (for_ns >= 0) {
		len = (uint64_t)for_ns;
	} else {
		len = min_ns;
		for (unsigned i = 0; i < b->level && len < max_ns; i++)
			len *= 2;
		if (len > max_ns)
			len = max_ns;
	}
	b->level++;
	uint64_t until = now + len;
	if (until > b->suspended_until)
		b->suspended_until = until;
	snprintf(b->why, sizeof(b->why), "%s", why ? why : "");
	return len;
}

void lane_budget_resume(struct lane_budget *b)
{
	b->suspended_until = 0;
	b->level = 0;
}

bool lane_budget_suspended(struct lane_budget *b, uint64_t now)
{
	if (b->suspended_until && now >= b->suspended_until)
		b->suspended_until = 0;
	return b->suspended_until != 0;
}
