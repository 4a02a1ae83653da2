/*
 * counter_milter.c -- the second reference point for the milter benchmark: the rate
 * limit a mail administrator writes on Sendmail's libmilter.
 *
 * Per recipient domain it counts recipients in a fixed window (-w seconds, default 60)
 * and, once a domain is over the limit (-l, default 1,000,000 so that a benchmark
 * measures the cost of counting and not refusals), answers that RCPT with
 * "451 4.7.1 Too much mail for DOMAIN".  This is the shape of a pmilter-style counting
 * prototype: one hash table, one pthread mutex around it, one thread per MTA connection
 * (libmilter's model), so every RCPT of every connection takes the same lock.
 *
 * Invariants:
 *  - The table holds at most -k keys (default 100,000).  A new key that does not fit
 *    first sweeps out the keys whose window has ended (once per window); if the table
 *    is still full the recipient is not counted (fail open, counted as "not counted").
 *  - Keys are the lowercased domain after the last '@' of the recipient, without its
 *    angle brackets, at most DOMAIN_MAX bytes; a recipient without a domain is not
 *    counted.
 *  - The window is fixed, not sliding: a key's count restarts when the current window
 *    (monotonic seconds / -w) differs from the one it was counted in.
 *
 * Like null_milter, it negotiates the stages it is told to (-s, from connect, helo,
 * mail, rcpt and eom; default all five) and skips the others with SMFIP_NO*; -R lists
 * stages negotiated without a reply (SMFIP_NR_*).  So a benchmark can give it exactly
 * the steps the filter it is compared with negotiates: 0x00000370 by default, as
 * null_milter and run_milter.sh's sluiced; -s connect,helo,mail,rcpt,eom
 * -R connect,helo,mail gives 0x00007370, as sluiced with rules decided at RCPT.  It asks for no modification actions.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "milter_common.h"

#define DOMAIN_MAX   255u       /* longest key kept (RFC 1035 name length) */
#define TABLE_SLOTS  65536u     /* hash buckets, a power of two */

struct counter {
	struct counter *next;   /* bucket chain */
	uint64_t window;        /* window the count belongs to */
	uint64_t count;
	size_t len;
	char domain[];          /* lowercase, NUL-terminated */
};

/* The stages -s and -R may name; rcpt (counts, and may refuse) and eom (the verdict)
 * are always registered and answered. */
#define STAGES_ALLOWED (MILTER_COMMON_BIT(MILTER_COMMON_CONNECT) | \
    MILTER_COMMON_BIT(MILTER_COMMON_HELO) | MILTER_COMMON_BIT(MILTER_COMMON_MAIL) | \
    STAGES_ALWAYS)
#define STAGES_ALWAYS (MILTER_COMMON_BIT(MILTER_COMMON_RCPT) | \
    MILTER_COMMON_BIT(MILTER_COMMON_EOM))

/* Set once in main() before smfi_main(); read-only in the callbacks. */
static uint64_t opt_limit = 1000000;
static uint64_t opt_window = 60;
static size_t opt_max_keys = 100000;

/* Everything below is protected by table_lock. */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct counter *table[TABLE_SLOTS];
static size_t table_keys;
static uint64_t last_sweep = UINT64_MAX; /* window of the last sweep */
static uint64_t stat_counted, stat_refused, stat_dropped, stat_swept;

static uint64_t now_window(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec / opt_window;
}

/* FNV-1a. */
static uint32_t hash(const char *s, size_t len)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < len; i++) {
		h ^= (uint8_t)s[i];
		h *= 16777619u;
	}
	return h;
}

/* Frees the keys whose window has ended.  Called with table_lock held when the table
 * is full; its O(keys) walk runs at most once per window, so a table full of live keys
 * does not turn every new key into a walk under the lock. */
static void table_sweep(uint64_t window)
{
	struct counter **pp, *c;

	if (last_sweep == window)
		return;
	last_sweep = window;
	for (size_t i = 0; i < TABLE_SLOTS; i++) {
		pp = &table[i];
		while ((c = *pp) != NULL) {
			if (c->window != window) {
				*pp = c->next;
				free(c);
				table_keys--;
				stat_swept++;
			} else {
				pp = &c->next;
			}
		}
	}
}

/*
 * Counts one recipient for domain (lowercase, len bytes) and returns the count in the
 * current window, or 0 when the key could not be stored (table full, no memory).
 */
static uint64_t table_count(const char *domain, size_t len)
{
	uint64_t window = now_window(), n = 0;
	uint32_t slot = hash(domain, len) & (TABLE_SLOTS - 1);
	struct counter *c;

	pthread_mutex_lock(&table_lock);
	for (c = table[slot]; c != NULL; c = c->next)
		if (c->len == len && memcmp(c->domain, domain, len) == 0)
			break;
	if (c == NULL) {
		if (table_keys >= opt_max_keys)
			table_sweep(window);
		if (table_keys < opt_max_keys)
			c = malloc(sizeof *c + len + 1);
		if (c == NULL) {
			stat_dropped++;
			pthread_mutex_unlock(&table_lock);
			return 0;
		}
		c->window = window;
		c->count = 0;
		c->len = len;
		memcpy(c->domain, domain, len);
		c->domain[len] = '\0';
		c->next = table[slot];
		table[slot] = c;
		table_keys++;
	}
	if (c->window != window) {
		c->window = window;
		c->count = 0;
	}
	n = ++c->count;
	stat_counted++;
	if (n > opt_limit)
		stat_refused++;
	pthread_mutex_unlock(&table_lock);
	return n;
}

/*
 * The lowercased domain of an envelope recipient ("<user@Example.COM>" or a bare
 * address) into buf (DOMAIN_MAX + 1 bytes).  Returns its length, or 0 when there is
 * no domain or it is too long.  Bytes other than letters, digits, '.', '-', '_', '[',
 * ']' and ':' become '?', so the key is safe to put in a reply text.
 */
static size_t rcpt_domain(const char *rcpt, char *buf)
{
	const char *at = strrchr(rcpt, '@'), *end;
	size_t len;

	if (at == NULL)
		return 0;
	at++;
	end = at + strlen(at);
	if (end > at && end[-1] == '>')
		end--;
	len = (size_t)(end - at);
	if (len == 0 || len > DOMAIN_MAX)
		return 0;
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)at[i];

		if (ch >= 'A' && ch <= 'Z')
			ch = (unsigned char)(ch - 'A' + 'a');
		else if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
		    ch == '-' || ch == '_' || ch == '[' || ch == ']' || ch == ':'))
			ch = '?';
		buf[i] = (char)ch;
	}
	buf[len] = '\0';
	return len;
}

/* ---- callbacks ------------------------------------------------------------------ */

static sfsistat counter_envrcpt(SMFICTX *ctx, char **argv)
{
	char domain[DOMAIN_MAX + 1], text[DOMAIN_MAX + 32];
	size_t len;
	int n;

	if (argv == NULL || argv[0] == NULL)
		return SMFIS_CONTINUE;
	len = rcpt_domain(argv[0], domain);
	if (len == 0 || table_count(domain, len) <= opt_limit)
		return SMFIS_CONTINUE;
	n = snprintf(text, sizeof text, "Too much mail for %s", domain);
	if (n < 0 || (size_t)n >= sizeof text)
		return SMFIS_TEMPFAIL;  /* cannot happen: text holds DOMAIN_MAX + the words */
	/* On failure libmilter sends a plain TEMPFAIL: the MTA's own 4xx. */
	(void)smfi_setreply(ctx, (char *)"451", (char *)"4.7.1", text);
	return SMFIS_TEMPFAIL;
}

static sfsistat counter_eom(SMFICTX *ctx)
{
	(void)ctx;
	return SMFIS_ACCEPT;
}

static sfsistat counter_abort(SMFICTX *ctx)
{
	(void)ctx;
	return SMFIS_CONTINUE;
}

static sfsistat counter_close(SMFICTX *ctx)
{
	(void)ctx;
	return SMFIS_CONTINUE;
}

/* ---- main ----------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: counter_milter -p SOCKET [-l LIMIT] [-w SECONDS] [-k KEYS] [-s STAGES] [-R STAGES]\n"
	    "                      [-b BACKLOG] [-T SECS]\n"
	    "A libmilter filter that counts recipients per domain in a fixed window and\n"
	    "tempfails (451 4.7.1) the recipients of a domain over the limit.\n"
	    "  -p SOCKET   unix:/path or inet:port@host (libmilter syntax)\n"
	    "  -l LIMIT    recipients per domain and window before refusing (default 1000000)\n"
	    "  -w SECONDS  window length (default 60)\n"
	    "  -k KEYS     most domains kept at once (default 100000)\n"
	    "  -s STAGES   stages negotiated, comma-separated, from connect helo mail rcpt eom;\n"
	    "              rcpt and eom are always in (default connect,helo,mail,rcpt,eom)\n"
	    "  -R STAGES   stages of -s negotiated without a reply: connect, helo, mail\n"
	    "  -b BACKLOG  listen backlog (default 4096)\n"
	    "  -T SECONDS  libmilter I/O timeout (default 7210)\n"
	    "On exit it prints what it counted to stderr.\n", f);
}

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v < min || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

int main(int argc, char **argv)
{
	struct smfiDesc desc;
	const char *sock = NULL, *reg = "connect,helo,mail,rcpt,eom", *nr = "";
	uint64_t backlog = 4096, timeout = 7210, keys = opt_max_keys;
	int ch, r;

	milter_common_prog = "counter_milter";
	while ((ch = getopt(argc, argv, "b:hk:l:p:R:s:T:w:")) != -1) {
		switch (ch) {
		case 'b': r = parse_u64(optarg, 1, 65535, &backlog); break;
		case 'k': r = parse_u64(optarg, 1, 100000000, &keys); break;
		case 'l': r = parse_u64(optarg, 0, UINT64_MAX - 1, &opt_limit); break;
		case 'p': sock = optarg; r = 0; break;
		case 'R': nr = optarg; r = 0; break;
		case 's': reg = optarg; r = 0; break;
		case 'T': r = parse_u64(optarg, 1, 86400, &timeout); break;
		case 'w': r = parse_u64(optarg, 1, 366u * 86400u, &opt_window); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
		if (r < 0) {
			fprintf(stderr, "counter_milter: bad value for -%c: %s\n", ch, optarg);
			return 2;
		}
	}
	if (sock == NULL || optind != argc) {
		usage(stderr);
		return 2;
	}
	opt_max_keys = (size_t)keys;
	if (milter_common_stages(reg, nr, STAGES_ALLOWED, STAGES_ALWAYS) < 0)
		return 2;
	for (int st = 0; st < MILTER_COMMON__MAX; st++) {
		if (milter_common_noreply[st] &&
		    (!milter_common_registered[st] || (STAGES_ALWAYS & MILTER_COMMON_BIT(st)))) {
			fprintf(stderr, "counter_milter: -R %s: %s\n", milter_common_stage_name(st),
			    milter_common_registered[st] ? "this stage is always answered" :
			    "stage not negotiated with -s");
			return 2;
		}
	}

	/* The MTA skips DATA, headers, EOH, body and unknown commands: -s cannot name them. */
	milter_common_desc(&desc, "counter_milter");
	desc.xxfi_envrcpt = counter_envrcpt;
	desc.xxfi_eom = counter_eom;
	desc.xxfi_abort = counter_abort;
	desc.xxfi_close = counter_close;
	if (milter_common_listen(sock, (int)backlog, (int)timeout, &desc) < 0)
		return 1;
	r = smfi_main() == MI_SUCCESS ? 0 : 1;
	pthread_mutex_lock(&table_lock);
	fprintf(stderr, "counter_milter: %zu domains, %llu recipients counted, %llu refused, "
	    "%llu not counted (table full), %llu keys swept\n", table_keys,
	    (unsigned long long)stat_counted, (unsigned long long)stat_refused,
	    (unsigned long long)stat_dropped, (unsigned long long)stat_swept);
	pthread_mutex_unlock(&table_lock);
	return r;
}
