/*
 * top -- `sluice top`: a live view of the daemon for an operator during an incident.
 *
 * Each refresh sends the control command `top` on one connection kept open, and draws
 * what it answers (see daemon_top() for the records): sessions per service, the queue,
 * the relay's outcomes per second, decisions per second per rule and verdict (from the
 * difference of the rules' counters between two refreshes), the keys nearest their
 * limits, and the relay's lanes, most important first, within 80x24.
 *
 * With a terminal on stdin, the terminal is put in non-canonical mode without echo so
 * that q quits at once; it is restored on every exit path (q, Ctrl-C, errors).  Batch
 * mode (-b N) prints N plain frames without terminal control, for scripts and tests.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "control.h"
#include "control_call.h"
#include "top.h"

#define TOP_MAX_RULES 256
#define TOP_MAX_SERVICES 16
#define TOP_MAX_LINES 16
#define TOP_DECISION_ROWS 8
#define TOP_KEY_ROWS 5
#define TOP_LANE_ROWS 4

struct top_rule {
	char name[64], stage[16], action[16];
	unsigned long long passed, over;
};

struct top_snap {
	double time;
	struct {
		char name[32];
		unsigned long long current, peak, connections;
	} svc[TOP_MAX_SERVICES];
	size_t nsvc;
	struct top_rule rule[TOP_MAX_RULES];
	size_t nrule;
	char key[TOP_MAX_LINES][160];
	size_t nkey;
	bool keys_shared;
	bool have_queue, have_relay;
	unsigned long long q_messages, q_held, q_rcpts, q_oldest;
	unsigned long long delivered, deferred, failed, suspensions;
	char lane[TOP_MAX_LINES][200];
	size_t nlane, lanes_total;
};

/* A row of the decisions table. */
struct top_row {
	const char *rule, *stage, *verdict;
	unsigned long long total;
	double rate; /* per second; < 0: not known yet (the first frame) */
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* One request, its reply's body into body (NUL-terminated).  0, or -1 with a message. */
static int call(int fd, const char *req, struct buf *body)
{
	bool ok = false;
	const char *why = "";
	int r = control_call(fd, req, strlen(req), body, &ok, &why, &stop);
	if (r == 0 && !ok)
		fprintf(stderr, "sluice top: %s", body->ptr);
	else if (r == -EPIPE)
		fprintf(stderr, "sluice top: sluiced closed the connection\n");
	else if (r == -EPROTO)
		fprintf(stderr, "sluice top: bad reply from sluiced: %s\n", why);
	else if (r == -EMSGSIZE)
		fprintf(stderr, "sluice top: reply too large\n");
	else if (r < 0 && r != -EINTR)
		fprintf(stderr, "sluice top: %s\n", strerror(-r));
	return r == 0 && ok ? 0 : -1;
}

static void top_parse(const char *text, struct top_snap *s)
{
	memset(s, 0, sizeof(*s));
	while (*text) {
		const char *nl = strchr(text, '\n');
		size_t len = nl ? (size_t)(nl - text) : strlen(text);
		char line[512];
		snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1),
			 text);
		text += len + (nl != NULL);
		if (strncmp(line, "time ", 5) == 0) {
			s->time = strtod(line + 5, NULL);
		} else if (strncmp(line, "svc ", 4) == 0 && s->nsvc < TOP_MAX_SERVICES) {
			if (sscanf(line + 4, "%31s %llu %llu %llu", s->svc[s->nsvc].name,
				   &s->svc[s->nsvc].current, &s->svc[s->nsvc].peak,
				   &s->svc[s->nsvc].connections) == 4)
				s->nsvc++;
		} else if (strncmp(line, "rule ", 5) == 0 && s->nrule < TOP_MAX_RULES) {
			struct top_rule *r = &s->rule[s->nrule];
			if (sscanf(line + 5, "%63s %15s %15s %llu %llu", r->name, r->stage, r->action,
				   &r->passed, &r->over) == 5)
				s->nrule++;
		} else if (strncmp(line, "key ", 4) == 0 && s->nkey < TOP_MAX_LINES) {
			snprintf(s->key[s->nkey++], sizeof(s->key[0]), "%.159s", line + 4);
		} else if (strcmp(line, "keys-shared") == 0) {
			s->keys_shared = true;
		} else if (strncmp(line, "queue ", 6) == 0) {
			s->have_queue = sscanf(line + 6, "%llu %llu %llu %llu", &s->q_messages,
					       &s->q_held, &s->q_rcpts, &s->q_oldest) == 4;
		} else if (strncmp(line, "relay ", 6) == 0) {
			s->have_relay = sscanf(line + 6, "%llu %llu %llu %llu", &s->delivered,
					       &s->deferred, &s->failed, &s->suspensions) == 4;
		} else if (strncmp(line, "lanes ", 6) == 0) {
			s->lanes_total = strtoul(line + 6, NULL, 10);
		} else if (strncmp(line, "lane ", 5) == 0 && s->nlane < TOP_MAX_LINES) {
			snprintf(s->lane[s->nlane++], sizeof(s->lane[0]), "%.199s", line + 5);
		}
	}
}

static const struct top_rule *prev_rule(const struct top_snap *prev, const struct top_rule *r)
{
	if (!prev)
		return NULL;
	for (size_t i = 0; i < prev->nrule; i++)
		if (strcmp(prev->rule[i].name, r->name) == 0 &&
		    strcmp(prev->rule[i].action, r->action) == 0)
			return &prev->rule[i];
	return NULL;
}

/* Counters restart at a reload: a counter that went down counts from zero. */
static double rate_of(unsigned long long now, unsigned long long before, double dt)
{
	return (double)(now >= before ? now - before : now) / dt;
}

static int row_cmp(const void *a, const void *b)
{
	const struct top_row *x = a, *y = b;
	if (x->rate != y->rate)
		return x->rate < y->rate ? 1 : -1;
	if (x->total != y->total)
		return x->total < y->total ? 1 : -1;
	return strcmp(x->rule, y->rule);
}

static void fmt_rate(char *out, size_t len, double rate)
{
	if (rate < 0)
		snprintf(out, len, "-");
	else
		snprintf(out, len, "%.1f", rate);
}

static void top_render(struct buf *out, const struct top_snap *s, const struct top_snap *prev,
		unsigned interval_s, bool batch)
{
	double dt = prev && s->time > prev->time ? s->time - prev->time : 0;
	time_t t = (time_t)s->time;
	struct tm tm;
	char when[32] = "";
	if (localtime_r(&t, &tm))
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	buf_printf(out, "sluice top  %s  every %u s%s\n", when, interval_s,
		   batch ? "" : "  (q quits)");

	buf_append_cstr(out, "sessions  now/peak");
	for (size_t i = 0; i < s->nsvc; i++)
		buf_printf(out, "  %s %llu/%llu", s->svc[i].name, s->svc[i].current,
			   s->svc[i].peak);
	buf_append_byte(out, '\n');
	if (s->have_queue)
		buf_printf(out, "queue     %llu messages (%llu held), %llu recipients to do, "
			   "oldest %llu s\n", s->q_messages, s->q_held, s->q_rcpts, s->q_oldest);
	if (s->have_relay) {
		char a[16], b[16], c[16];
		bool known = dt > 0 && prev && prev->have_relay;
		fmt_rate(a, sizeof(a), known ? rate_of(s->delivered, prev->delivered, dt) : -1);
		fmt_rate(b, sizeof(b), known ? rate_of(s->deferred, prev->deferred, dt) : -1);
		fmt_rate(c, sizeof(c), known ? rate_of(s->failed, prev->failed, dt) : -1);
		buf_printf(out, "relay     sent %s/s  deferred %s/s  failed %s/s  total %llu/%llu/%llu"
			   "  susp %llu\n", a, b, c, s->delivered, s->deferred, s->failed,
			   s->suspensions);
	}

	/* decisions: one row per rule and verdict, busiest first */
	struct top_row rows[2 * TOP_MAX_RULES];
	size_t n = 0;
	for (size_t i = 0; i < s->nrule; i++) {
		const struct top_rule *r = &s->rule[i];
		const struct top_rule *p = dt > 0 ? prev_rule(prev, r) : NULL;
		if (r->over)
			rows[n++] = (struct top_row){ r->name, r->stage, r->action, r->over,
						      p ? rate_of(r->over, p->over, dt) : -1 };
		if (r->passed)
			rows[n++] = (struct top_row){ r->name, r->stage, "pass", r->passed,
						      p ? rate_of(r->passed, p->passed, dt) : -1 };
	}
	qsort(rows, n, sizeof(rows[0]), row_cmp);
	buf_printf(out, "\n%-28s %-8s %-10s %10s %12s\n", "decisions: rule", "stage", "verdict",
		   "per s", "total");
	if (s->nrule == 0)
		buf_append_cstr(out, "(no limit rules)\n");
	else if (n == 0)
		buf_append_cstr(out, "(no decision yet)\n");
	for (size_t i = 0; i < n && i < TOP_DECISION_ROWS; i++) {
		char rate[16];
		fmt_rate(rate, sizeof(rate), rows[i].rate);
		buf_printf(out, "%-28.28s %-8s %-10s %10s %12llu\n", rows[i].rule, rows[i].stage,
			   rows[i].verdict, rate, rows[i].total);
	}
	if (n > TOP_DECISION_ROWS)
		buf_printf(out, "(%zu more rows: sluice decisions)\n", n - TOP_DECISION_ROWS);

	buf_append_cstr(out, "\nkeys nearest their limits\n");
	if (s->keys_shared)
		buf_append_cstr(out, "(the keys live in Redis)\n");
	else if (s->nkey == 0)
		buf_append_cstr(out, "(no key is above half of its limit)\n");
	for (size_t i = 0; i < s->nkey && i < TOP_KEY_ROWS; i++)
		buf_printf(out, "%.79s\n", s->key[i]);

	if (s->lanes_total) {
		buf_append_cstr(out, "\nlanes\n");
		size_t shown = 0;
		for (; shown < s->nlane && shown < TOP_LANE_ROWS; shown++)
			buf_printf(out, "%.79s\n", s->lane[shown]);
		if (s->lanes_total > shown)
			buf_printf(out, "(%zu more lanes: sluice lanes)\n", s->lanes_total - shown);
	}
}

static struct termios saved_tio;
static bool tio_saved;

static void tty_restore(void)
{
	if (tio_saved) {
		tcsetattr(STDIN_FILENO, TCSANOW, &saved_tio);
		tio_saved = false;
	}
}

/* Waits up to ms; true when the operator asked to quit (q, Q, or a signal). */
static bool wait_or_quit(int ms, bool tty)
{
	struct timespec end;
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += ms / 1000;
	end.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	for (;;) {
		if (stop)
			return true;
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		long left = (long)(end.tv_sec - now.tv_sec) * 1000 +
			    (end.tv_nsec - now.tv_nsec) / 1000000L;
		if (left <= 0)
			return false;
		struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
		int r = poll(&pfd, tty ? 1 : 0, (int)left);
		if (r > 0) {
			char c;
			ssize_t got = read(STDIN_FILENO, &c, 1);
			if (got == 1 && (c == 'q' || c == 'Q'))
				return true;
			if (got == 0)
				tty = false; /* end of input: only the clock now */
		}
	}
}

int top_run(int fd, unsigned interval_s, long batch)
{
	bool tty = batch == 0 && isatty(STDIN_FILENO);
	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN); /* a daemon gone is an error reported, not a signal */
	if (tty && tcgetattr(STDIN_FILENO, &saved_tio) == 0) {
		struct termios raw = saved_tio;
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO); /* ISIG stays: Ctrl-C is SIGINT */
		raw.c_cc[VMIN] = 1;
		raw.c_cc[VTIME] = 0;
		tio_saved = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
	}
	struct top_snap *cur = calloc(1, sizeof(*cur)), *prev = calloc(1, sizeof(*prev));
	struct buf body, out;
	buf_init(&body, CONTROL_BODY_MAX + 1);
	buf_init(&out, 1 << 20);
	int rc = 0;
	bool have_prev = false;
	if (!cur || !prev) {
		fprintf(stderr, "sluice top: out of memory\n");
		rc = 1;
	}
	for (long frame = 0; rc == 0 && !stop && (batch == 0 || frame < batch); frame++) {
		if (frame && wait_or_quit((int)interval_s * 1000, tty))
			break;
		if (call(fd, "top\n", &body) < 0) {
			rc = stop ? 0 : 1;
			break;
		}
		top_parse(body.ptr, cur);
		buf_reset(&out);
		if (!batch)
			buf_append_cstr(&out, "\033[H\033[2J");
		else if (frame)
			buf_append_byte(&out, '\n');
		top_render(&out, cur, have_prev ? prev : NULL, interval_s, batch != 0);
		fwrite(out.ptr, 1, out.len, stdout);
		fflush(stdout);
		struct top_snap *t = prev;
		prev = cur;
		cur = t;
		have_prev = true;
	}
	tty_restore();
	buf_done(&body);
	buf_done(&out);
	free(cur);
	free(prev);
	return rc;
}
