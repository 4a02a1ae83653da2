/*
 * util -- small generic helpers (see util.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int fd_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int fd_set_cloexec(int fd)
{
	int fl = fcntl(fd, F_GETFD);
	if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
		return -errno;
	return 0;
}

int64_t fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int64_t n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n ? n - 1 : 0; /* not the directory's own descriptor */
}

int fmt_fixed(char *dst, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(dst, len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -EINVAL;
	if ((size_t)n >= len)
		return -ENOBUFS;
	return 0;
}

int dir_sync(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

int dir_sync_parent(const char *path)
{
	char parent[4096];
	const char *slash = strrchr(path, '/');
	if (!slash)
		return dir_sync(".");
	size_t n = slash == path ? 1 : (size_t)(slash - path);
	if (n >= sizeof(parent))
		return -ENAMETOOLONG;
	memcpy(parent, path, n);
	parent[n] = '\0';
	return dir_sync(parent);
}

int file_read_all(const char *path, size_t max, char **ret, size_t *ret_len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return -EFBIG;
	}
	size_t cap = (size_t)st.st_size + 1, len = 0;
	char *p = malloc(cap);
	if (!p) {
		close(fd);
		return -ENOMEM;
	}
	for (;;) {
		if (len + 1 >= cap) {
			if (cap > max) {
				free(p);
				close(fd);
				return -EFBIG;
			}
			char *q = realloc(p, cap * 2);
			if (!q) {
				free(p);
				close(fd);
				return -ENOMEM;
			}
			p = q;
			cap *= 2;
		}
		ssize_t n = read(fd, p + len, cap - 1 - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			int e = -errno;
			free(p);
			close(fd);
			return e;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (len > max) {
		free(p);
		return -EFBIG;
	}
	p[len] = '\0';
	*ret = p;
	*ret_len = len;
	return 0;
}

static _Thread_local struct event_base *current_base;

void thread_set_base(struct event_base *b)
{
	current_base = b;
}

struct event_base *thread_base(void)
{
	return current_base;
}

void fmt_rfc5322_date(char *out, size_t len, time_t t, long utc_offset)
{
	static const char days[7][4] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
	static const char months[12][4] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
					    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };
	time_t local = t + (time_t)utc_offset;
	struct tm tm;
	gmtime_r(&local, &tm);
	long off = utc_offset < 0 ? -utc_offset : utc_offset;
	/* names from tables, not strftime: the locale must not change a protocol field */
	snprintf(out, len, "%s, %d %s %d %02d:%02d:%02d %c%02ld%02ld", days[tm.tm_wday],
		 tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
		 tm.tm_sec, utc_offset < 0 ? '-' : '+', off / 3600, off / 60 % 60);
}

static _Atomic unsigned shard_next;
static _Thread_local unsigned shard_mine; /* 0: none yet; else the index + 1 */

unsigned thread_shard(void)
{
	if (!shard_mine) {
		unsigned n = atomic_fetch_add_explicit(&shard_next, 1, memory_order_relaxed);
		shard_mine = (n < THREAD_SHARDS - 1 ? n : THREAD_SHARDS - 1) + 1;
	}
	return shard_mine - 1;
}

int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

uint64_t random_u64(void)
{
	static _Thread_local uint64_t x;
	if (x == 0) {
		if (getrandom(&x, sizeof(x), GRND_NONBLOCK) != sizeof(x) || x == 0)
			x = now_ns() | 1;
	}
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	return x * 0x2545F4914F6CDD1DULL;
}

/* pct% of v without overflow */
static uint64_t percent(uint64_t v, unsigned pct)
{
	return v / 100 * pct + v % 100 * pct / 100;
}

uint64_t jitter(uint64_t v, unsigned below_pct, unsigned above_pct)
{
	uint64_t low = v - percent(v, below_pct < 100 ? below_pct : 100);
	uint64_t span = percent(v, below_pct) + percent(v, above_pct);
	uint64_t r = span ? random_u64() % (span + 1) : 0;
	return UINT64_MAX - low < r ? UINT64_MAX : low + r;
}

static const struct {
	const char *name;
	uint64_t ms;
} units[] = {
	{ "d", 86400000 }, { "h", 3600000 }, { "m", 60000 }, { "s", 1000 },
};

const char *fmt_duration(char *out, size_t len, uint64_t ms, enum duration_style style)
{
	if (style == DURATION_EXACT) {
		if (ms != 0 && ms % (7 * units[0].ms) == 0) {
			snprintf(out, len, "%" PRIu64 "w", ms / (7 * units[0].ms));
			return out;
		}
		for (size_t u = 0; u < ARRAY_SIZE(units); u++)
			if (ms != 0 && ms % units[u].ms == 0) {
				snprintf(out, len, "%" PRIu64 "%s", ms / units[u].ms, units[u].name);
				return out;
			}
		snprintf(out, len, "%" PRIu64 "ms", ms);
		return out;
	}
	if (style == DURATION_BRIEF) {
		if (ms == UINT64_MAX)
			snprintf(out, len, "never");
		else if (ms < 1000)
			snprintf(out, len, "%" PRIu64 "ms", ms);
		else if (ms < 60000)
			snprintf(out, len, "%.1fs", (double)ms / 1e3);
		else if (ms < 3600000)
			snprintf(out, len, "%" PRIu64 "m%02" PRIu64 "s", ms / 60000, ms / 1000 % 60);
		else if (ms < 86400000)
			snprintf(out, len, "%" PRIu64 "h%02" PRIu64 "m", ms / 3600000, ms / 60000 % 60);
		else
			snprintf(out, len, "%" PRIu64 "d%02" PRIu64 "h", ms / 86400000,
				 ms / 3600000 % 24);
		return out;
	}
	/* DURATION_UP: whole seconds, then the smaller unit rounded up into the larger */
	uint64_t s = ms / 1000 + (ms % 1000 != 0);
	if (s >= 86400 && s % 3600)
		s += 3600 - s % 3600;
	else if (s >= 3600 && s % 60)
		s += 60 - s % 60;
	for (size_t u = 0; u < ARRAY_SIZE(units); u++) {
		uint64_t big = units[u].ms / 1000;
		if (s < big && u + 1 < ARRAY_SIZE(units))
			continue;
		uint64_t small = u + 1 < ARRAY_SIZE(units) ? units[u + 1].ms / 1000 : 1;
		uint64_t rest = s % big / small;
		if (rest && u + 1 < ARRAY_SIZE(units))
			snprintf(out, len, "%" PRIu64 "%s%" PRIu64 "%s", s / big, units[u].name, rest,
				 units[u + 1].name);
		else
			snprintf(out, len, "%" PRIu64 "%s", s / big, units[u].name);
		return out;
	}
	return out;
}

size_t text_sanitize(char *dst, size_t dstlen, struct str s, size_t max, unsigned flags)
{
	if (dstlen == 0)
		return 0;
	size_t limit = max < dstlen - 1 ? max : dstlen - 1, n = 0, i = 0;
	bool space = false;
	for (; i < s.len && n < limit; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		if (flags & TEXT_FOLD_SPACE) {
			if (c == '\0')
				continue;
			if (c == ' ' || (c >= '\t' && c <= '\r')) {
				space = true;
				continue;
			}
			if (space && n > 0) {
				if (limit - n < 2)
					break; /* no room for the space and what follows it */
				dst[n++] = ' ';
			}
			space = false;
		}
		if (c < 0x20 || c >= 0x7f || (c == '"' && (flags & TEXT_NO_QUOTES)))
			c = '?';
		dst[n++] = (char)c;
	}
	if ((flags & TEXT_MARK_CUT) && i < s.len && n + 3 < dstlen) {
		memcpy(dst + n, "...", 3);
		n += 3;
	}
	dst[n] = '\0';
	return n;
}

bool secret_equal(struct str given, struct str want)
{
	volatile unsigned char diff = given.len != want.len;
	for (size_t i = 0; i < want.len; i++) {
		/* what a shorter guess lacks counts as 0: the loop runs want.len times */
		unsigned char g = i < given.len ? (unsigned char)given.ptr[i] : 0;
		diff |= g ^ (unsigned char)want.ptr[i];
	}
	return diff == 0;
}
