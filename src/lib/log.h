/*
 * log -- one line per event, to stderr or syslog, safe from any thread.
 *
 * Library layers log at debug only; sessions and the daemon log with context
 * ("sid=... peer=...") that they put in front of the message themselves (see
 * session_log() in the engine).  Peer-supplied strings must go through log_quote().
 * A test can install a sink to capture lines (log_set_sink()).
 */
#ifndef SLUICE_LOG_H
#define SLUICE_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "str.h"

enum log_level {
	LOG_LEVEL_DEBUG = 0,
	LOG_LEVEL_INFO,
	LOG_LEVEL_NOTICE,
	LOG_LEVEL_WARNING,
	LOG_LEVEL_ERROR,
	LOG_LEVEL_CRIT,
};

enum log_target {
	LOG_TARGET_STDERR = 0,
	LOG_TARGET_SYSLOG,
};

typedef void log_sink_fn(enum log_level level, const char *line);

/* Configure; may be called again on reload.  facility is a syslog LOG_* facility.  With
 * target stderr, it also decides whether stderr is the journal (log_stderr_is_journal()),
 * and then each line is its sd-daemon(3) priority, its level and the message ("<3>error:
 * ..."; the journal adds the time and identifier), control characters made spaces. */
void log_setup(enum log_target target, int facility, enum log_level level);
/* JOURNAL_STREAM names the device and inode of fd 2 now (systemd.exec(5)). */
bool log_stderr_is_journal(void);
/* "<3>" for LOG_LEVEL_ERROR etc. when stderr is the journal now, else "": for the few
 * lines a program writes to stderr itself before log_setup() (a configuration error at
 * start).  Checks the environment and fd 2 at each call. */
const char *log_stderr_prefix(enum log_level level);
void log_set_level(enum log_level level);
bool log_enabled(enum log_level level);
void log_set_sink(log_sink_fn *sink);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_vmsg(enum log_level level, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));

#define log_debug(...) do { if (log_enabled(LOG_LEVEL_DEBUG)) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__); } while (0)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_LEVEL_NOTICE, __VA_ARGS__)
#define log_warning(...) log_msg(LOG_LEVEL_WARNING, __VA_ARGS__)
#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)

/* Parse "debug", "info", ... ; returns 0 or -EINVAL. */
int log_level_from_name(const char *name, enum log_level *ret);
int log_facility_from_name(const char *name, int *ret);
const char *log_level_name(enum log_level level);

/*
 * Render peer bytes for a log line: printable ASCII kept, '"' and '\\' escaped, other bytes
 * as \xHH, cut after max input bytes with "..." appended.  Always NUL-terminates dst
 * (dstlen > 0) and returns dst.
 */
const char *log_quote(char *dst, size_t dstlen, struct str s, size_t max);

/* Print to the log at CRIT and exit(1): for a broken environment only. */
_Noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* An assertion that is never compiled out: a broken invariant aborts with its location. */
#define ASSERT(x) do { if (__builtin_expect(!(x), 0)) assert_failed(#x, __FILE__, __LINE__); } while (0)
_Noreturn void assert_failed(const char *expr, const char *file, int line);

#endif
