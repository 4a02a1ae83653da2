/*
 * relay_hist -- the persisted send history, state_dir/relay.lanes, on the relay's thread
 * (and relay_new's, which loads it): every send and suspension appended as a line, so
 * that a restart neither exceeds a window nor sends into a ban; compacted by the sweep.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "dsn.h"
#include "relay_int.h"
#include "util.h"

/* ---- the send history (state_dir/relay.lanes) ---- */

/*
 * One line of the history: "NAME US" for a send, "S NAME UNTIL_US WHY" for a suspension
 * (UNTIL 0: lifted; the last line of a lane wins, so a restart does not send into a ban).
 * The length, or -1 when it does not fit.
 */
static int hist_format(char *buf, size_t len, const char *name, uint64_t us, const char *why)
{
	int n = why ? snprintf(buf, len, "S %s %" PRIu64 " %s\n", name, us, why)
		    : snprintf(buf, len, "%s %" PRIu64 "\n", name, us);
	return n > 0 && (size_t)n < len ? n : -1;
}

static void hist_write(struct relay *r, const char *name, uint64_t us, const char *why)
{
	if (r->hist_fd < 0)
		return;
	char line[900];
	int n = hist_format(line, sizeof(line), name, us, why);
	if (n < 0)
		return;
	/* one write per line, O_APPEND: in the page cache at once, so a killed daemon loses
	 * none; flushed before the send it records goes out (tx_send), so that a
	 * power cut loses none the next hop saw */
	ssize_t w = write(r->hist_fd, line, (size_t)n);
	(void)w;
	r->hist_lines++;
	r->hist_seq++;
}

static void hist_sync_now(struct relay *r)
{
	int rc = r->hist_fd >= 0 && fdatasync(r->hist_fd) < 0 ? -errno : 0;
	hist_synced(r, r->hist_seq, rc);
}

/* The history written so far goes to disk: by the flusher, or here without one.  One
 * flush at a time; what is written meanwhile waits for the next, which then covers all
 * of it (a group commit of the sends). */
void hist_sync(struct relay *r)
{
	if (r->hist_syncing || r->hist_synced >= r->hist_seq)
		return;
	if (flush_post_hist(r))
		r->hist_syncing = true;
	else
		hist_sync_now(r);
}

/* Whether lines of the history are written but not known to be on disk: the send they
 * record must wait for them (tx_send). */
bool hist_pending(const struct relay *r)
{
	return r->hist_fd >= 0 && r->hist_synced < r->hist_seq;
}

/* The history is on disk up to line seq (rc 0), or could not be flushed (rc < 0): the
 * transactions waiting for it may go (tx_hist_synced).  A failing disk is logged and
 * does not stop the relay: the budget in memory stays exact, only a power cut could
 * then lose sends. */
void hist_synced(struct relay *r, uint64_t seq, int rc)
{
	r->hist_syncing = false;
	if (rc < 0) {
		base_logf(r, LOG_LEVEL_ERROR, "%s/%s cannot be flushed: %s (the sends go on; a "
			  "power cut now could forget them)", r->crt->conf.state_dir, HISTORY_FILE,
			  strerror(-rc));
	}
	if (seq > r->hist_synced)
		r->hist_synced = seq;
}


void hist_append(struct relay *r, const char *lane, uint64_t t_ns)
{
	hist_write(r, lane, (t_ns + 999) / 1000, NULL);
}

void hist_append_suspension(struct relay *r, const struct lane *l)
{
	char why[300];
	text_sanitize(why, sizeof(why), str_cstr(l->b.why), SIZE_MAX,
				      TEXT_NO_QUOTES);
	hist_write(r, l->name, l->b.suspended_until / 1000, why);
	hist_sync(r); /* nothing waits for it, but a restart after a power cut must see it */
}

/* Keep a loaded entry (copies name and why); false when out of memory. */
static bool hist_push(struct relay *r, const char *name, uint64_t us, const char *why)
{
	if (r->nhist % 1024 == 0) {
		struct hist_entry *h = realloc(r->hist, (r->nhist + 1024) * sizeof(*h));
		if (!h)
			return false;
		r->hist = h;
	}
	struct hist_entry *e = &r->hist[r->nhist];
	*e = (struct hist_entry){ .name = strdup(name), .us = us, .why = why ? strdup(why) : NULL,
				  .line = r->nhist };
	if (!e->name || (why && !e->why)) {
		free(e->name);
		free(e->why);
		return false;
	}
	r->nhist++;
	return true;
}

static uint64_t max_window_ns(const struct relay_conf *c)
{
	uint64_t m = 0;
	for (size_t i = 0; i < c->nroutes; i++)
		for (unsigned j = 0; j < c->routes[i].rate.n; j++) {
			uint64_t w = c->routes[i].rate.w[j].period_ns +
				     (uint64_t)c->routes[i].guard_ms * 1000000u;
			if (w > m)
				m = w;
		}
	/* a provider's lane keeps its own windows, under the guard of the route it came from:
	 * the longest route guard bounds it */
	uint64_t guard = 0;
	for (size_t i = 0; i < c->nroutes; i++)
		if ((uint64_t)c->routes[i].guard_ms * 1000000u > guard)
			guard = (uint64_t)c->routes[i].guard_ms * 1000000u;
	for (size_t i = 0; i < c->nproviders; i++)
		for (unsigned j = 0; j < c->providers[i].rate.n; j++)
			if (c->providers[i].rate.w[j].period_ns + guard > m)
				m = c->providers[i].rate.w[j].period_ns + guard;
	return m;
}

/* Rewrite the history with what still counts: the lanes' remembered sends, and loaded
 * entries of lanes not made yet. */
void hist_compact(struct relay *r)
{
	if (!r->crt->conf.state_dir)
		return;
	char path[4096], tmp[4200];
	snprintf(path, sizeof(path), "%s/%s", r->crt->conf.state_dir, HISTORY_FILE);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "we");
	if (!f)
		return;
	uint64_t now_us = relay_now(r) / 1000;
	uint64_t keep = max_window_ns(&r->crt->conf) / 1000 + 1;
	uint64_t lines = 0;
	char line[900];
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		const struct slide *best = NULL;
		for (unsigned i = 0; i < l->b.rate.n; i++)
			if (!best || l->b.win[i].len > best->len)
				best = &l->b.win[i];
		for (uint32_t k = 0; best && k < best->len; k++) {
			uint64_t us = best->at[(best->head + k) % best->cap];
			if (us + keep > now_us && hist_format(line, sizeof(line), l->name, us,
								      NULL) > 0) {
				fputs(line, f);
				lines++;
			}
		}
	}
	TAILQ_FOREACH(l, &r->lanes, link)
		if (l->b.suspended_until / 1000 > now_us) {
			char why[300];
			text_sanitize(why, sizeof(why), str_cstr(l->b.why), SIZE_MAX,
				      TEXT_NO_QUOTES);
			if (hist_format(line, sizeof(line), l->name, l->b.suspended_until / 1000,
					why) > 0) {
				fputs(line, f);
				lines++;
			}
		}
	for (size_t i = 0; i < r->nhist; i++) {
		if (r->hist[i].taken)
			continue;
		bool live = r->hist[i].why ? r->hist[i].us > now_us
					   : r->hist[i].us + keep > now_us;
		if (live && hist_format(line, sizeof(line), r->hist[i].name, r->hist[i].us,
					r->hist[i].why) > 0) {
			fputs(line, f);
			lines++;
		}
	}
	/* on disk before it replaces the history, and its name after: a power cut leaves
	 * the old file or the new one, whole */
	bool ok = fflush(f) == 0 && fdatasync(fileno(f)) == 0;
	if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
		unlink(tmp);
		return;
	}
	dir_sync(r->crt->conf.state_dir);
	if (r->hist_fd >= 0)
		close(r->hist_fd);
	r->hist_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	r->hist_lines = lines;
}

static int hist_cmp(const void *a, const void *b)
{
	const struct hist_entry *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* Sort the loaded entries by lane, each lane's in file order, and end every suspension
 * of a lane but its last line's (a resume or a new suspension is written after). */
static void hist_sort(struct relay *r)
{
	if (r->nhist)
		qsort(r->hist, r->nhist, sizeof(*r->hist), hist_cmp);
	bool later = false; /* a suspension of this lane on a later line */
	for (size_t i = r->nhist; i-- > 0;) {
		if (i + 1 == r->nhist || strcmp(r->hist[i + 1].name, r->hist[i].name) != 0)
			later = false;
		if (r->hist[i].why) {
			if (later)
				r->hist[i].us = 0;
			later = true;
		}
	}
}

size_t hist_find(const struct relay *r, const char *name, size_t *ret_n)
{
	size_t lo = 0, hi = r->nhist;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(r->hist[mid].name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	size_t n = 0;
	while (lo + n < r->nhist && strcmp(r->hist[lo + n].name, name) == 0)
		n++;
	*ret_n = n;
	return lo;
}

int hist_load(struct relay *r, char *err, size_t errlen)
{
	r->hist_fd = -1;
	if (!r->crt->conf.state_dir)
		return 0;
	if (mkdir(r->crt->conf.state_dir, 0700) == 0) {
		dir_sync_parent(r->crt->conf.state_dir); /* made: its name kept by a power cut */
	} else if (errno != EEXIST) {
		snprintf(err, errlen, "state_dir %s: %s", r->crt->conf.state_dir, strerror(errno));
		return -errno;
	}
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", r->crt->conf.state_dir, HISTORY_FILE);
	char *text = NULL;
	size_t len = 0;
	int rc = file_read_all(path, HISTORY_MAX, &text, &len);
	if (rc < 0 && rc != -ENOENT) {
		snprintf(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	uint64_t now_us = relay_now(r) / 1000;
	uint64_t keep = max_window_ns(&r->crt->conf) / 1000 + 1;
	/* Lines by length, not as one C string: a power cut may leave a stretch of zero
	 * bytes where a page of the file was not written back, with the lines appended
	 * after the restart behind it.  A line holding a zero byte is read from the byte
	 * after its last one (what came before is the torn end of an older line). */
	char *end_of_text = text ? text + len : NULL;
	bool text_ended_torn = len > 0 && text[len - 1] != '\n';
	for (char *line = text, *next; line && line < end_of_text; line = next) {
		char *nl = memchr(line, '\n', (size_t)(end_of_text - line));
		char *seg_end = nl ? nl : end_of_text; /* *end_of_text is the reader's NUL */
		*seg_end = '\0';
		next = nl ? nl + 1 : end_of_text;
		char *zero = memrchr(line, '\0', (size_t)(seg_end - line));
		if (zero)
			line = zero + 1;
		if (strncmp(line, "S ", 2) == 0) {
			char *name = line + 2, *sp1 = strchr(name, ' ');
			char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
			if (!sp2)
				continue;
			*sp1 = *sp2 = '\0';
			unsigned long long until = strtoull(sp1 + 1, NULL, 10);
			/* kept even when over: the last line of a lane wins (hist_sort) */
			if (!hist_push(r, name, until, sp2 + 1))
				break;
			continue;
		}
		char *sp = strrchr(line, ' ');
		if (!sp || sp == line)
			continue; /* a line cut by a crash: ignored */
		*sp = '\0';
		char *end;
		unsigned long long us = strtoull(sp + 1, &end, 10);
		if (*end || us + keep <= now_us || us > now_us + 60000000ull)
			continue;
		if (!hist_push(r, line, us, NULL))
			break;
	}
	free(text);
	hist_sort(r);
	r->hist_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (r->hist_fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	/* a last line cut by a crash or a power cut ends here, so that the first line
	 * appended now is a line of its own */
	if (len > 0 && text_ended_torn) {
		ssize_t w = write(r->hist_fd, "\n", 1);
		(void)w;
	}
	/* the file's name on disk (it may have been made just now), before any send is
	 * recorded in it: a flush of its data alone would not keep the name */
	rc = dir_sync(r->crt->conf.state_dir);
	if (rc < 0) {
		snprintf(err, errlen, "%s: fsync: %s", r->crt->conf.state_dir, strerror(-rc));
		return rc;
	}
	r->hist_lines = r->nhist;
	return 0;
}
