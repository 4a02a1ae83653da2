/*
 * loadgen.h -- what the benchmark's load generators (milter_load, policy_load) share:
 * their common options, the run phases (setup, warm-up, measurement, drain), a
 * single-threaded edge-triggered epoll loop with a retry list and a 100 ms tick,
 * non-blocking connect, read and write on a connection, the latency histogram, the
 * server's CPU time, threads and RSS from /proc (--pid), and the parts of the human and
 * JSON reports that read alike.
 *
 * The protocol stays in each program.  It embeds a struct loadgen_conn in its own
 * connection, keeps its own connection states, and gives the loop its callbacks in a
 * struct loadgen_ops.  A "unit" below is what a program measures: a milter session, a
 * policy request.
 *
 * Invariants:
 *  - One thread, one struct loadgen per process.  lg->now is the time of the event being
 *    handled; the loop refreshes it before each callback.
 *  - Only the MEASURE phase launches measured units; the run ends when it may launch
 *    no more (-n reached, -t elapsed, SIGINT/SIGTERM) and every slot has retired.
 *  - A broken environment (a bad option, socket or epoll failing, no server to connect
 *    to at all) exits through loadgen_fatal() with status 2, its message prefixed with
 *    loadgen_prog.
 */
#ifndef SLUICE_BENCH_LOADGEN_H
#define SLUICE_BENCH_LOADGEN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#define LOADGEN_NS_PER_S 1000000000ull

#define LOADGEN_CHECK(x) \
	do { if (!(x)) loadgen_check_failed(#x, __FILE__, __LINE__); } while (0)

/* The program's name, for messages; main() sets it before anything else. */
extern const char *loadgen_prog;

_Noreturn void loadgen_check_failed(const char *expr, const char *file, int line);
_Noreturn void loadgen_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* loadgen_fatal("HEAD: WHY; stopping"), WHY formatted from fmt and ap (and truncated):
 * for a peer that does not speak the protocol, whose numbers would mean nothing. */
_Noreturn void loadgen_vstop(const char *head, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

uint64_t loadgen_clock_ns(void);

/* ---- options --------------------------------------------------------------------- */

/* The options both programs take, parsed by loadgen_parse_args(). */
struct loadgen_opts {
	const char *target;     /* -p or the operand */
	const char *label;      /* --label */
	unsigned concurrency;   /* -c */
	uint64_t count;         /* -n: units to measure, 0: limited by duration */
	double duration;        /* -t: 0: limited by count */
	double warmup;          /* -w */
	double timeout;         /* -T */
	long pid;               /* --pid: server process to watch in /proc, 0: none */
	bool json;              /* --json */
};

/* An unsigned decimal in [min, max]; exits on anything else, naming it "what". */
unsigned long long loadgen_parse_num(const char *s, unsigned long long min,
    unsigned long long max, const char *what);
/* Seconds, 0 to 86400, fractions allowed; exits on anything else. */
double loadgen_parse_secs(const char *s, const char *what);

/* One of a program's own options, for loadgen_parse_args(): a number in [min, max]
 * stored into an unsigned or a size_t, or a flag that sets a bool. */
enum loadgen_arg_kind {
	LOADGEN_ARG_UNSIGNED = 0,
	LOADGEN_ARG_SIZE,
	LOADGEN_ARG_FLAG,
};

struct loadgen_arg {
	int short_name;         /* -X, 0: a long option only */
	const char *long_name;  /* --name, NULL: a short option only */
	enum loadgen_arg_kind kind;
	void *dst;              /* unsigned *, size_t * or bool *, as kind says */
	unsigned long long min, max;
	const char *what;       /* names the number in the error for a bad one */
};

/* At most this many options of a program's own. */
#define LOADGEN_ARGS_MAX 16

/*
 * The one option parser of the load generators: the program's own options (args, n of
 * them, stored where each says), the common ones into o (-c -n -p -t -T -w, --json
 * --label --pid), -h (usage(stdout), exit 0), and the SOCKET operand.  An unknown option,
 * a missing or extra operand: usage(stderr), exit 2; a bad value exits naming it.
 * Afterwards the duration defaults to 5 s without -n, and -T must be above 0.
 * count_what names -n's unit in messages ("sessions").
 */
void loadgen_parse_args(struct loadgen_opts *o, int argc, char **argv,
    const struct loadgen_arg *args, size_t n, const char *count_what,
    void (*usage)(FILE *f));

/* ---- latency --------------------------------------------------------------------- */

/* Latency histogram: exact below 256 ns, then 128 buckets per power of two (<1% error). */
#define LOADGEN_HIST_SUB     128u
#define LOADGEN_HIST_OCTAVES 40u
#define LOADGEN_HIST_BUCKETS (2u * LOADGEN_HIST_SUB + LOADGEN_HIST_OCTAVES * LOADGEN_HIST_SUB)

struct loadgen_hist {
	uint64_t count;
	uint64_t max;
	double sum;
	uint64_t bucket[LOADGEN_HIST_BUCKETS];
};

void loadgen_hist_add(struct loadgen_hist *h, uint64_t v);
/* The value below which a fraction q of the recorded values lie (a bucket's middle). */
double loadgen_hist_quantile(const struct loadgen_hist *h, double q);

/* ---- the server process (--pid), from /proc ---------------------------------------- */

struct loadgen_proc {
	long pid;               /* 0: not watched */
	long rss_kb_before;     /* before any connection */
	long rss_kb_load;       /* at the start of the load phase */
	long rss_kb_max;        /* peak during the load phase */
	long threads_max;
	double cpu_start;       /* utime+stime at the start of the load phase, seconds */
	double cpu_end;
	bool ok;                /* the load phase was watched from start to end */
};

/* utime+stime of all the process's threads, in seconds; -1 if unreadable. */
double loadgen_proc_cpu(long pid);
/* Threads and VmRSS (kB) of the process.  Returns 0 or a negative errno. */
int loadgen_proc_status(long pid, long *ret_threads, long *ret_rss_kb);
/* Folds the current threads and RSS into the peaks (when --pid was given). */
void loadgen_proc_sample(struct loadgen_proc *p);

/* ---- connections and the loop --------------------------------------------------------- */

/* The part of a connection the loop handles; a program embeds it in its own. */
struct loadgen_conn {
	int fd;                 /* -1: no socket */
	unsigned id;
	uint64_t since;         /* last progress, for the program's timeouts */
	uint64_t retry_at;
	struct loadgen_conn *retry_next;
};

/* What the load generators count as errors, in the order their reports list them;
 * each program names them (LOADGEN_ERR_PROTO in its own protocol's terms). */
enum loadgen_err {
	LOADGEN_ERR_UNEXPECTED = 0, /* a reply where none was due */
	LOADGEN_ERR_MISSING,        /* no reply (or no close) within the timeout */
	LOADGEN_ERR_PROTO,          /* a reply the protocol does not allow there */
	LOADGEN_ERR_CLOSED,         /* the server closed the connection */
	LOADGEN_ERR_CONNECT,        /* connect failed or timed out */
	LOADGEN_ERR_IO,             /* read or write error */
	LOADGEN_ERR__MAX,
};

/* loadgen_read(): the peer closed the connection. */
#define LOADGEN_EOF 1

enum loadgen_phase {
	LOADGEN_SETUP = 0,      /* before the load: ops->setup, if any */
	LOADGEN_WARMUP,         /* units run, not measured */
	LOADGEN_MEASURE,
	LOADGEN_DRAIN,          /* no more launches; waiting for every slot to retire */
	LOADGEN_DONE,
};

struct loadgen_ops {
	/* epoll events on c. */
	void (*event)(struct loadgen_conn *c, uint32_t events);
	/* c's time in the retry list is up. */
	void (*retry)(struct loadgen_conn *c);
	/* Every 100 ms: the program's timeouts. */
	void (*tick)(void);
	/* NULL, or called in LOADGEN_SETUP after each round of events: returns true once
	 * the load phase may start. */
	bool (*setup)(void);
	/* Starts load slot i (0 to concurrency - 1) at the start of the load phase. */
	void (*start)(unsigned i);
	/* Bytes read from c.  Returns 0, or < 0 when it failed c (c is then closed). */
	int (*feed)(struct loadgen_conn *c, const void *p, size_t n);
	/* Connecting, writing or reading c failed (c->fd may still be open): count error
	 * e, close c and abandon its unit. */
	void (*fail)(struct loadgen_conn *c, enum loadgen_err e, const char *why);
};

struct loadgen {
	struct loadgen_opts opt;
	const struct loadgen_ops *ops;
	int ep;
	int family;
	struct sockaddr_storage addr;
	socklen_t addrlen;

	enum loadgen_phase phase;
	uint64_t now;
	uint64_t t_warm_end;
	uint64_t t0;            /* start of the measurement */
	uint64_t t_stop;        /* end of launching with -t */
	uint64_t t_end;         /* last measured unit finished */
	uint64_t timeout_ns;
	uint64_t next_tick;
	struct loadgen_conn *retry_head;

	unsigned active;        /* load slots not retired */
	uint64_t launched;      /* measured units started */
	uint64_t completed;     /* measured units finished */
	uint64_t failed;        /* measured units abandoned on an error */
	uint64_t completed_all; /* units finished in the load phase, warm-up included */
	uint64_t connect_retries;
	bool ever_connected;

	struct loadgen_hist hist;
	struct loadgen_proc proc;
};

/*
 * Prepares a run from lg->opt: resolves the target, raises the open files limit for
 * conns connections, ignores SIGPIPE and catches SIGINT and SIGTERM, reads the --pid
 * process's RSS (exits if it cannot), creates the epoll set.  ops must outlive the run.
 */
void loadgen_init(struct loadgen *lg, const struct loadgen_ops *ops, unsigned long long conns);
void loadgen_fini(struct loadgen *lg);

/* Runs the loop until the run is over, then reads the server's final CPU time. */
void loadgen_run(struct loadgen *lg);
/* Whether SIGINT or SIGTERM arrived. */
bool loadgen_interrupted(void);
/* Whether a slot may launch a unit now. */
bool loadgen_launch_allowed(const struct loadgen *lg);
/* A unit starts: returns whether it is measured, and counts it if so. */
bool loadgen_begin(struct loadgen *lg);
/* A measured unit that started at t_start ended at t_last. */
void loadgen_done(struct loadgen *lg, uint64_t t_start, uint64_t t_last);
/* A measured unit was abandoned on an error, now. */
void loadgen_failed(struct loadgen *lg);

/* Queues c to be handed to ops->retry delay_ns from now. */
void loadgen_retry_push(struct loadgen *lg, struct loadgen_conn *c, uint64_t delay_ns);

/*
 * Opens a non-blocking socket for c to the target and starts connecting it; the socket
 * is in the epoll set, edge-triggered, with c as its data.  Returns 0 when connected at
 * once, -EINPROGRESS when under way (c->since is set), -EAGAIN when a unix socket's
 * backlog is full (counted; c->fd closed: the caller retries), or another negative
 * errno once ops->fail has had c.  Exits if the server could never be reached.
 */
int loadgen_connect(struct loadgen *lg, struct loadgen_conn *c);
/* The outcome of connecting c, on its events: -EINPROGRESS while not known yet, 0 when
 * connected, or a negative errno once ops->fail has had c (exits if the server could
 * never be reached). */
int loadgen_connect_result(struct loadgen *lg, struct loadgen_conn *c, uint32_t events);
/*
 * Writes buf[*off, *len) to c.  Returns 0 when all is written (*off and *len are then
 * 0), -EAGAIN when the socket is full, or -EPIPE once ops->fail has had c.
 */
int loadgen_write(struct loadgen *lg, struct loadgen_conn *c, const void *buf, size_t *off,
    size_t *len);
/*
 * Reads what arrived on c and hands it to ops->feed, until the socket is empty or feed
 * fails.  hup: the event reported the peer's close, whose edge is consumed with this
 * event, so read on to EOF even after a short read.  Returns 0, LOADGEN_EOF (the
 * caller decides what the close means), or -EPIPE once ops->fail has had c.
 */
int loadgen_read(struct loadgen *lg, struct loadgen_conn *c, bool hup);
/* Whether c has made no progress for the timeout (-T). */
bool loadgen_timed_out(const struct loadgen *lg, const struct loadgen_conn *c);

/* ---- report -------------------------------------------------------------------------- */

struct loadgen_summary {
	double elapsed;         /* seconds from the start of the measurement to its last unit */
	double rate;            /* completed units per second */
	double p50, p90, p99, max, mean;        /* latency, ms */
	double cpu;             /* server CPU seconds over the load phase (--pid) */
	double cpu_per;         /* server CPU microseconds per unit completed in it */
};

void loadgen_summarize(const struct loadgen *lg, struct loadgen_summary *ret);
uint64_t loadgen_total(const uint64_t *counts, size_t n);

/* {"label":...,"target":... (the caller goes on with ,"concurrency":...). */
void loadgen_json_begin(const struct loadgen *lg);
void loadgen_json_string(const char *s);
/* "latency_ms":{"p50":...,"mean":...} */
void loadgen_json_latency(const struct loadgen_summary *s);
/* "key":{"name0":count0,...} */
void loadgen_json_counts(const char *key, const char *const *names, const uint64_t *counts,
    size_t n);
/* "errors":{"total":...,"name0":count0,...}, of LOADGEN_ERR__MAX counts */
void loadgen_json_errors(const char *const *names, const uint64_t *counts);
/* Ends the JSON line. */
void loadgen_json_end(void);
/* The "latency ms" line of the table. */
void loadgen_print_latency(const struct loadgen_summary *s);
/* The "errors" line of the table: the total, and each kind when there are any. */
void loadgen_print_errors(const char *const *names, const uint64_t *counts);

#endif
