/*
 * rate -- rate windows ("10/1m", "500/1d:600") and per-key override files.
 *
 * A window is COUNT per PERIOD with a BURST (default: the count).  The text form is
 *   COUNT[k|M|G]/[N]UNIT[:BURST]      UNIT: s, m, h, d, w   (e.g. "10/1m", "2k/h", "5/30s:10")
 * k, M and G multiply by 1000 (SI), for byte counts as for messages.  "0" alone means
 * unlimited (only in override files).
 *
 * An overrides file gives per-key windows for one rule, one key per line:
 *   # comment
 *   example.com        100/1m, 5000/1d
 *   bulk.example.org   0                  # unlimited
 * The key is the first whitespace-delimited token; the rest of the line is a comma-
 * separated list of at most RATE_MAX_WINDOWS windows, or "0" alone.  '#' starts a comment
 * at the start of a line or anywhere after the key (a '#' inside the key is part of it).
 * A key given twice is an error naming both lines.  Errors name the file and the line.
 * Lookups are O(1) (a hash table over the keys).
 *
 * Pure code: no I/O except rate_overrides_load() reading one file.
 */
#ifndef SLUICE_RATE_H
#define SLUICE_RATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "str.h"

#define RATE_MAX_WINDOWS 4
#define RATE_MAX_OVERRIDE_KEY 512        /* bytes in one override key */
#define RATE_MAX_OVERRIDES_FILE (64u << 20)

struct rate_window {
	uint64_t count;     /* > 0 */
	uint64_t period_ns; /* > 0 */
	uint64_t burst;     /* > 0; default = count */
};

struct rate_limits {
	unsigned n;         /* 0 = unlimited */
	struct rate_window w[RATE_MAX_WINDOWS];
};

/*
 * Parse one window.  Returns 0 and fills *ret, or -EINVAL with a message in err (without
 * file or line: the caller adds them).  Counts and bursts are in [1, 10^15], periods in
 * [1 s, 366 d].
 */
int rate_window_parse(struct str text, struct rate_window *ret, char *err, size_t errlen);
/* Write "10/1m" (or "10/1m:20" when burst != count) into buf, with the largest unit that
 * divides the period and the counts in plain digits; rate_window_parse() reads it back to
 * the same window.  64 bytes always suffice (shorter buffers truncate); returns buf. */
const char *rate_window_format(const struct rate_window *w, char *buf, size_t len);

struct rate_overrides;

/*
 * Load an overrides file.  0 and *ret (an empty file gives an empty table), or -errno with
 * err "FILE:LINE: message" (syntax) or "FILE: strerror" (I/O).  normalize, if not NULL, is
 * applied to each key before it is stored (lowercasing domains, say); it writes at most
 * RATE_MAX_OVERRIDE_KEY bytes to out and returns the length, or -1 to reject the key.
 */
typedef int rate_key_normalize_fn(struct str key, char *out, void *arg);
int rate_overrides_load(const char *path, rate_key_normalize_fn *normalize, void *arg,
			struct rate_overrides **ret, char *err, size_t errlen);
/* Same, from text already in memory (file_name only for messages). */
int rate_overrides_parse(const char *file_name, const char *text, size_t len,
			 rate_key_normalize_fn *normalize, void *arg,
			 struct rate_overrides **ret, char *err, size_t errlen);
/* The limits for key, or NULL when the file does not mention it.  key must already be
 * normalized the way the file's keys were (the table holds only normalized keys). */
const struct rate_limits *rate_overrides_find(const struct rate_overrides *o, struct str key);
size_t rate_overrides_count(const struct rate_overrides *o);
struct rate_overrides *rate_overrides_free(struct rate_overrides *o);

#endif
