/*
 * util -- small generic helpers (see util.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
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
