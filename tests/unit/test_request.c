/*
 * test_request -- the decisions of the engine's requests (src/engine/request.c): how long
 * an open request may take and has left, and which may give way to a newcomer at
 * max_sessions.
 *
 * Table-driven: a session's request (implicit or explicit, silent, partial or data with
 * its bytes) at a moment, and the answer; then a worker's open requests, oldest first, and
 * the one that gives way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine_int.h"

enum kind { SILENT = 0, PARTIAL, DATA };

struct req_case {
	const char *what;
	enum kind kind;
	uint64_t command_timeout, base, min_rate, max; /* ms, ms, bytes/s, ms */
	uint64_t elapsed, bytes;
	bool paused, closing;
	/* expected */
	uint64_t allowed;
	bool evictable;
	uint64_t slow; /* of 1024, when evictable */
	uint64_t left; /* ms before its deadline; 0 past it */
};

static void test_decisions(void **state)
{
	(void)state;
	static const struct req_case cases[] = {
		{ "a connection that has sent nothing gives way at once", SILENT, 5000, 0, 0, 0,
		  0, 0, false, false, 5000, true, 0, 5000 },
		{ "a partial command, halfway to its deadline", PARTIAL, 5000, 0, 0, 0, 2500, 0,
		  false, false, 5000, true, 512, 2500 },
		{ "past its deadline, it is the slowest there can be", PARTIAL, 2000, 0, 0, 0,
		  4000, 0, false, false, 2000, true, 2048, 0 },
		{ "a paused session never gives way", PARTIAL, 5000, 0, 0, 0, 4000, 0, true,
		  false, 5000, false, 0, 1000 },
		{ "nor one already closing", SILENT, 5000, 0, 0, 0, 4000, 0, false, true, 5000,
		  false, 0, 1000 },
		{ "data earns a second per min_rate bytes past its base", DATA, 5000, 5000, 1024,
		  60000, 1000, 10240, false, false, 15000, false, 0, 14000 },
		{ "data on time never gives way, however long", DATA, 5000, 5000, 1024, 3600000,
		  50000, 1024 * 60, false, false, 65000, false, 0, 15000 },
		{ "data behind its rate does, as slow as it is", DATA, 5000, 5000, 1024, 60000,
		  3000, 1024, false, false, 6000, true, 512, 3000 },
		{ "what data earns stops at its maximum", DATA, 5000, 5000, 1, 8000, 7000,
		  1000000, false, false, 8000, false, 0, 1000 },
		{ "data with no rate: its maximum, and no way out before half of it", DATA, 5000,
		  60000, 0, 60000, 29000, 0, false, false, 60000, false, 0, 31000 },
		{ "data with no rate gives way past half its deadline", DATA, 5000, 60000, 0,
		  60000, 30000, 0, false, false, 60000, true, 512, 30000 },
		{ "a clock read before the start counts as no time, not a wrap", PARTIAL, 5000, 0,
		  0, 0, 0, 0, false, false, 5000, true, 0, 5000 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct req_case *t = &cases[i];
		struct service svc;
		struct session s;
		memset(&svc, 0, sizeof(svc));
		memset(&s, 0, sizeof(s));
		atomic_store(&svc.command_timeout_ms, t->command_timeout);
		s.svc = &svc;
		s.paused = t->paused;
		s.closing = t->closing;
		s.req_listed = true;
		s.req_start_ms = 1000000;
		s.req_armed = t->kind != SILENT;
		s.req_explicit = t->kind == DATA;
		s.rb = (struct request_bound){ .base_ms = t->base, .min_rate = t->min_rate,
					       .max_ms = t->max };
		s.req_bytes = t->bytes;
		uint64_t now = s.req_start_ms + t->elapsed;
		if (i == sizeof(cases) / sizeof(cases[0]) - 1)
			now = s.req_start_ms - 5; /* the last case: a clock behind the start */
		print_message("%s\n", t->what);
		assert_int_equal(request_allowed_ms(&s), t->allowed);
		uint64_t slow = 12345;
		bool ev = request_evictable(&s, now, &slow);
		assert_int_equal(ev, t->evictable);
		if (ev)
			assert_int_equal(slow, t->slow);
		else
			assert_int_equal(slow, 12345); /* untouched when it may not */
		assert_int_equal(request_time_left(&s, now), t->left);
	}
}

/* One open request of a worker's list: partial (command_timeout 5000 ms) or data with no
 * rate (60000 ms), open `elapsed` ms at the moment of the choice. */
struct open_req {
	bool data, paused;
	uint64_t elapsed;
};

#define NREQ 10

struct victim_case {
	const char *what;
	size_t n;
	struct open_req reqs[NREQ]; /* oldest first */
	int victim; /* index, -1 for none */
};

static void test_victim(void **state)
{
	(void)state;
	static const struct victim_case cases[] = {
		{ "no open request: none gives way", 0, { { false, false, 0 } }, -1 },
		{ "the slowest of the oldest", 3,
		  { { false, false, 3000 }, { false, false, 2000 }, { false, false, 1000 } }, 0 },
		{ "a paused session is passed over", 3,
		  { { false, true, 3000 }, { false, false, 2000 }, { false, false, 1000 } }, 1 },
		{ "all paused: none", 2, { { false, true, 3000 }, { false, true, 2000 } }, -1 },
		{ "slow against its own deadline, not the oldest", 2,
		  { { true, false, 40000 }, { false, false, 4000 } }, 1 },
		{ "data before half its deadline is passed over", 2,
		  { { true, false, 29000 }, { false, false, 10 } }, 1 },
		{ "only the eight oldest are looked at", 9,
		  { { true, false, 40000 }, { true, false, 39000 }, { true, false, 38000 },
		    { true, false, 37000 }, { true, false, 36000 }, { true, false, 35000 },
		    { true, false, 34000 }, { true, false, 33000 }, { false, false, 29000 } }, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct victim_case *t = &cases[i];
		static struct worker w;
		static struct service svc;
		static struct session s[NREQ];
		memset(&w, 0, sizeof(w));
		memset(&svc, 0, sizeof(svc));
		memset(s, 0, sizeof(s));
		atomic_store(&svc.command_timeout_ms, 5000);
		uint64_t now = 1000000;
		for (size_t k = 0; k < t->n; k++) {
			s[k].svc = &svc;
			s[k].w = &w;
			s[k].paused = t->reqs[k].paused;
			s[k].req_listed = true;
			s[k].req_armed = true;
			s[k].req_explicit = t->reqs[k].data;
			s[k].rb = (struct request_bound){ .base_ms = 60000, .max_ms = 60000 };
			s[k].req_start_ms = now - t->reqs[k].elapsed;
			s[k].rprev = k ? &s[k - 1] : NULL;
			s[k].rnext = k + 1 < t->n ? &s[k + 1] : NULL;
		}
		w.reqs[svc.idx].head = t->n ? &s[0] : NULL;
		w.reqs[svc.idx].tail = t->n ? &s[t->n - 1] : NULL;
		print_message("%s\n", t->what);
		struct session *v = request_victim(&w, &svc, now);
		if (t->victim < 0)
			assert_null(v);
		else
			assert_ptr_equal(v, &s[t->victim]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decisions),
		cmocka_unit_test(test_victim),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
