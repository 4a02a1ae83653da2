/*
 * log -- lines to stderr or syslog (see log.h).
 *
 * A line is formatted into a stack buffer and written with one write(2) so that lines
 * from several threads never interleave.  Lines longer than LOG_LINE_MAX are cut.
 *
 * When stderr is the journal (systemd sets JOURNAL_STREAM=DEV:INO to the stream it gave
 * the service; fd 2 must still be that stream, as sd_journal_stream_fd(3) consumers
 * check), each line starts with its priority as sd-daemon(3) writes it ("<3>" for an
 * error), which journald strips and files as the entry's PRIORITY; the facility is the
 * unit's SyslogFacility=.  This is decided in log_setup() (start and reload), not per line.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define LOG_LINE_MAX 4096

static _Atomic int log_level_cur = LOG_LEVEL_INFO;
static _Atomic int log_target_cur = LOG_TARGET_STDERR;
static _Atomic bool log_journal;     /* stderr is the journal's stream: prefix "<N>" */
static log_sink_fn *_Atomic log_sink;

static const char *const level_names[] = {
	[LOG_LEVEL_DEBUG] = "debug",     [LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_NOTICE] = "notice",   [LOG_LEVEL_WARNING] = "warning",
	[LOG_LEVEL_ERROR] = "error",     [LOG_LEVEL_CRIT] = "crit",
};

static const int level_prio[] = {
	[LOG_LEVEL_DEBUG] = LOG_DEBUG,     [LOG_LEVEL_INFO] = LOG_INFO,
	[LOG_LEVEL_NOTICE] = LOG_NOTICE,   [LOG_LEVEL_WARNING] = LOG_WARNING,
	[LOG_LEVEL_ERROR] = LOG_ERR,       [LOG_LEVEL_CRIT] = LOG_CRIT,
};

bool log_stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	if (!e || !*e)
		return false;
	char *end;
	errno = 0;
	unsigned long long dev = strtoull(e, &end, 10);
	if (errno || end == e || *end != ':')
		return false;
	const char *ino_s = end + 1;
	unsigned long long ino = strtoull(ino_s, &end, 10);
	if (errno || end == ino_s || *end)
		return false;
	struct stat st;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* sd-daemon(3)'s prefix of a level: its syslog priority (level_prio) in angle brackets. */
static const char *journal_prefix(enum log_level level)
{
	static const char *const by_prio[] = { "<0>", "<1>", "<2>", "<3>",
					       "<4>", "<5>", "<6>", "<7>" };
	return by_prio[level_prio[level]];
}

const char *log_stderr_prefix(enum log_level level)
{
	if ((size_t)level >= sizeof(level_prio) / sizeof(level_prio[0]) ||
	    !log_stderr_is_journal())
		return "";
	return journal_prefix(level);
}

void log_setup(enum log_target target, int facility, enum log_level level)
{
	if (target == LOG_TARGET_SYSLOG)
		openlog("sluiced", LOG_PID | LOG_NDELAY, facility);
	atomic_store(&log_journal, target == LOG_TARGET_STDERR && log_stderr_is_journal());
	atomic_store(&log_target_cur, (int)target);
	atomic_store(&log_level_cur, (int)level);
}

void log_set_level(enum log_level level)
{
	atomic_store(&log_level_cur, (int)level);
}

bool log_enabled(enum log_level level)
{
	return (int)level >= atomic_load_explicit(&log_level_cur, memory_order_relaxed);
}

void log_set_sink(log_sink_fn *sink)
{
	atomic_store(&log_sink, sink);
}

const char *log_level_name(enum log_level level)
{
	if ((size_t)level < sizeof(level_names) / sizeof(level_names[0]))
		return level_names[level];
	return "?";
}

int log_level_from_name(const char *name, enum log_level *ret)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
		if (strcasecmp(name, level_names[i]) == 0) {
			*ret = (enum log_level)i;
			return 0;
		}
	if (strcasecmp(name, "err") == 0) {
		*ret = LOG_LEVEL_ERROR;
		return 0;
	}
	return -EINVAL;
}

int log_facility_from_name(const char *name, int *ret)
{
	static const struct {
		const char *name;
		int value;
	} facilities[] = {
		{ "mail", LOG_MAIL },	  { "daemon", LOG_DAEMON }, { "user", LOG_USER },
		{ "local0", LOG_LOCAL0 }, { "local1", LOG_LOCAL1 }, { "local2", LOG_LOCAL2 },
		{ "local3", LOG_LOCAL3 }, { "local4", LOG_LOCAL4 }, { "local5", LOG_LOCAL5 },
		{ "local6", LOG_LOCAL6 }, { "local7", LOG_LOCAL7 },
	};
	for (size_t i = 0; i < sizeof(facilities) / sizeof(facilities[0]); i++)
		if (strcasecmp(name, facilities[i].name) == 0) {
			*ret = facilities[i].value;
			return 0;
		}
	return -EINVAL;
}

void log_vmsg(enum log_level level, const char *fmt, va_list ap)
{
	if (!log_enabled(level))
		return;
	char line[LOG_LINE_MAX];
	size_t off = 0;
	int target = atomic_load(&log_target_cur);
	log_sink_fn *sink = atomic_load(&log_sink);
	bool journal = false;
	if (target == LOG_TARGET_STDERR && !sink) {
		if (atomic_load_explicit(&log_journal, memory_order_relaxed)) {
			/* sd-daemon(3): "<3>" for SD_ERR; the journal adds the time and
			 * "sluiced[PID]:" (SyslogIdentifier=) itself */
			journal = true;
			int w = snprintf(line, sizeof(line), "%s%s: ", journal_prefix(level),
					 log_level_name(level));
			off = w > 0 ? (size_t)w : 0;
		} else {
			struct timespec ts;
			struct tm tm;
			clock_gettime(CLOCK_REALTIME, &ts);
			localtime_r(&ts.tv_sec, &tm);
			size_t n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
			int w = snprintf(line + n, sizeof(line) - n, ".%03ld sluiced[%ld]: %s: ",
					 ts.tv_nsec / 1000000, (long)getpid(), log_level_name(level));
			off = n + (w > 0 ? (size_t)w : 0);
		}
	}
	int w = vsnprintf(line + off, sizeof(line) - off - 1, fmt, ap);
	if (w < 0)
		return;
	size_t len = off + (size_t)w;
	if (len > sizeof(line) - 2) {
		len = sizeof(line) - 2;
		memcpy(line + len - 3, "...", 3);
	}
	/* the journal cuts entries at LF (and would read a "<N>" after it as the next
	 * entry's priority): a control character in a message becomes a space */
	if (journal)
		for (size_t i = off; i < len; i++)
			if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
				line[i] = ' ';
	if (sink) {
		line[len] = '\0';
		sink(level, line + off);
		return;
	}
	if (target == LOG_TARGET_SYSLOG) {
		line[len] = '\0';
		syslog(level_prio[level], "%s", line);
		return;
	}
	line[len++] = '\n';
	ssize_t r;
	do
		r = write(STDERR_FILENO, line, len);
	while (r < 0 && errno == EINTR);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vmsg(level, fmt, ap);
	va_end(ap);
}

const char *log_quote(char *dst, size_t dstlen, struct str s, size_t max)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	if (dstlen == 0)
		return dst;
	size_t n = s.len < max ? s.len : max;
	bool cut = s.len > max;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		char tmp[4];
		size_t tl;
		if (c == '"' || c == '\\') {
			tmp[0] = '\\';
			tmp[1] = (char)c;
			tl = 2;
		} else if (c >= 0x20 && c < 0x7f) {
			tmp[0] = (char)c;
			tl = 1;
		} else {
			tmp[0] = '\\';
			tmp[1] = 'x';
			tmp[2] = hex[c >> 4];
			tmp[3] = hex[c & 15];
			tl = 4;
		}
		if (o + tl + 4 > dstlen) { /* keep room for "..." and NUL */
			cut = true;
			break;
		}
		memcpy(dst + o, tmp, tl);
		o += tl;
	}
	if (cut && o + 4 <= dstlen) {
		memcpy(dst + o, "...", 3);
		o += 3;
	}
	dst[o] = '\0';
	return dst;
}

_Noreturn void fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vmsg(LOG_LEVEL_CRIT, fmt, ap);
	va_end(ap);
	exit(1);
}

_Noreturn void assert_failed(const char *expr, const char *file, int line)
{
	log_msg(LOG_LEVEL_CRIT, "assertion failed: %s at %s:%d", expr, file, line);
	abort();
}
