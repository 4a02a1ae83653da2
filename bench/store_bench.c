/*
 * store_bench -- the memory store's speed and size: decide() checks per second on one
 * thread over random existing keys, and bytes per (key, window) record.
 *
 *   store_bench [--keys N] [--seconds S] [--json]
 *
 * The store is filled with N live keys (default 1,000,000), one window each (100/1h), so
 * every check finds its record and charges it (no key fills its burst during the run).
 * Time is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so that the rate is per core
 * even when the machine is busy; the rate per wall-clock second is printed as well.
 * Memory is the growth of the resident set (/proc/self/statm) across the filling, with
 * everything the benchmark itself needs allocated and touched before; the tables' own
 * size (stats.bytes) is reported too.  The keys of each block of checks are drawn before
 * the clock starts; "with hashing" also times store_key_hash() over the key text, as a
 * worker computes it for every item.
 *
 * Last, the expiry sweep's CPU time per call over the full table (nothing expires).
 *
 * Targets: >= 5 million checks/s on one core, <= 64 bytes per key and window.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store.h"

#define BLOCK 65536
#define KEY_TEXT 40

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time of this thread: the figure is per core even on a busy machine */
static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long size = 0, resident = 0;
	if (!f)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &resident) != 2)
		resident = 0;
	fclose(f);
	return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void key_text(char *out, uint64_t i)
{
	snprintf(out, KEY_TEXT, "sender-%llu@example.org", (unsigned long long)i);
}

static void usage(void)
{
	fprintf(stderr, "usage: store_bench [--keys N] [--seconds S] [--json]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	uint64_t keys = 1000000;
	double seconds = 3;
	bool json = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = true;
		else if (strcmp(argv[i], "--keys") == 0 && i + 1 < argc)
			keys = strtoull(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
			seconds = strtod(argv[++i], NULL);
		else
			usage();
	}
	if (keys == 0 || seconds <= 0)
		usage();

	const struct str rule = str_cstr("per-sender");
	const struct rate_limits limits = { 1, { { 100, 3600000000000ull, 100 } } };
	uint64_t *hashes = malloc(keys * sizeof(*hashes));
	uint64_t *block = malloc(BLOCK * sizeof(*block));
	char(*texts)[KEY_TEXT] = malloc(BLOCK * sizeof(*texts));
	if (!hashes || !block || !texts) {
		fprintf(stderr, "store_bench: out of memory\n");
		return 1;
	}
	memset(hashes, 0, keys * sizeof(*hashes));
	memset(block, 0, BLOCK * sizeof(*block));
	memset(texts, 0, BLOCK * sizeof(*texts));

	struct store_memory_conf conf = { .max_keys = keys, .snapshot = NULL };
	char warn[256];
	uint64_t now = wall_ns();
	struct store *s = store_memory_new(&conf, now, warn, sizeof(warn));
	if (!s) {
		fprintf(stderr, "store_bench: out of memory\n");
		return 1;
	}

	/* fill */
	uint64_t rss_before = rss_bytes(), t_fill = mono_ns();
	for (uint64_t i = 0; i < keys; i++) {
		char text[KEY_TEXT];
		key_text(text, i);
		hashes[i] = store_key_hash(s, rule, str_cstr(text));
		struct store_item it = { .key_hash = hashes[i], .rule = rule,
					 .key = str_cstr(text), .limits = &limits, .cost = 1,
					 .flags = STORE_BLOCKING };
		if (store_decide(s, &it, 1, STORE_CHECK, now) != 1) {
			fprintf(stderr, "store_bench: filling: key %llu refused\n",
				(unsigned long long)i);
			return 1;
		}
	}
	t_fill = mono_ns() - t_fill;
	uint64_t rss_after = rss_bytes();
	struct store_stats st;
	s->ops->stats(s->ctx, &st);
	if (st.keys != keys) {
		fprintf(stderr, "store_bench: %llu records held, %llu expected\n",
			(unsigned long long)st.keys, (unsigned long long)keys);
		return 1;
	}

	/* decide() alone, then with the key hash */
	uint64_t checks[2] = { 0, 0 }, spent[2] = { 0, 0 }, wall[2] = { 0, 0 }, refused = 0;
	for (int pass = 0; pass < 2; pass++) {
		uint64_t budget = (uint64_t)(seconds * 1e9);
		while (spent[pass] < budget) {
			for (size_t b = 0; b < BLOCK; b++) {
				uint64_t k = rnd() % keys;
				if (pass == 0)
					block[b] = hashes[k];
				else
					key_text(texts[b], k);
			}
			uint64_t t = cpu_ns(), w = mono_ns();
			uint64_t at = now + wall[0] + wall[1];
			for (size_t b = 0; b < BLOCK; b++) {
				struct store_item it = { .rule = rule, .limits = &limits,
							 .cost = 1, .flags = STORE_BLOCKING };
				if (pass == 0) {
					it.key_hash = block[b];
				} else {
					it.key = str_make(texts[b], strlen(texts[b]));
					it.key_hash = store_key_hash(s, rule, it.key);
				}
				refused += store_decide(s, &it, 1, STORE_CHECK, at) != 1;
			}
			spent[pass] += cpu_ns() - t;
			wall[pass] += mono_ns() - w;
			checks[pass] += BLOCK;
		}
	}
	/* the expiry sweep, as the daemon's main thread calls it once a second: nothing
	 * expires (every record is live for an hour), so this is the cost of the visit */
	uint64_t sweep_calls = 20, t_sweep = cpu_ns();
	for (uint64_t i = 0; i < sweep_calls; i++)
		s->ops->expire(s->ctx, now + wall[0] + wall[1] + i * 1000000000ull);
	double sweep_ms = (double)(cpu_ns() - t_sweep) / 1e6 / (double)sweep_calls;
	double rate = (double)checks[0] * 1e9 / (double)spent[0];
	double rate_hashed = (double)checks[1] * 1e9 / (double)spent[1];
	double rate_wall = (double)checks[0] * 1e9 / (double)wall[0];
	double rss_per = (double)(rss_after - rss_before) / (double)keys;
	double table_per = (double)st.bytes / (double)keys;
	if (json)
		printf("{\"keys\":%llu,\"windows_per_key\":1,\"checks_per_sec\":%.0f,"
		       "\"checks_per_sec_with_key_hash\":%.0f,\"checks_per_wall_sec\":%.0f,"
		       "\"bytes_per_key_window_rss\":%.1f,"
		       "\"bytes_per_key_window_tables\":%.1f,\"fill_sec\":%.3f,\"refused\":%llu,"
		       "\"expire_ms_per_call\":%.2f}\n",
		       (unsigned long long)keys, rate, rate_hashed, rate_wall, rss_per, table_per,
		       (double)t_fill / 1e9, (unsigned long long)refused, sweep_ms);
	else
		printf("store_bench: %llu keys x 1 window (100/1h), filled in %.2f s\n"
		       "  decide: %.2f M checks per CPU second on one thread (%.2f M with "
		       "store_key_hash; %.2f M per wall second)\n"
		       "  memory: %.1f bytes per key-window (RSS growth), %.1f in the tables\n"
		       "  expiry sweep: %.2f ms of CPU per call (sluiced calls it once a second)\n",
		       (unsigned long long)keys, (double)t_fill / 1e9, rate / 1e6, rate_hashed / 1e6,
		       rate_wall / 1e6, rss_per, table_per, sweep_ms);
	if (refused && !json)
		printf("  (%llu checks refused: with few keys, they ran out of burst)\n",
		       (unsigned long long)refused);
	store_free(s);
	free(hashes);
	free(block);
	free(texts);
	return 0;
}
