/*
 * daemon_fds -- the daemon's file descriptors: the soft limit raised to the hard one at
 * start, the share-out of fd_plan.c made for each configuration (start and reload), and
 * the count once every part is up.  What the daemon and its reserve hold back is handed
 * to the engine, which counts the sessions' share at accept.
 *
 * The one writer of d->nofile, d->fds_open and d->fds_held; main thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon_int.h"
#include "engine.h"
#include "fd_plan.h"
#include "log.h"
#include "util.h"

/* Descriptors open now (0 when /proc cannot tell). */
static unsigned count_open_fds(void)
{
	int64_t n = fd_count();
	return n > 0 ? (unsigned)n : 0;
}

static unsigned plan_workers(const struct sluice_config *c)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return c->workers ? c->workers : n > 0 ? (unsigned)n : 1;
}

/*
 * Descriptors for configuration c (start and reload): what the daemon holds and keeps in
 * reserve, and what the sessions may share.  At start, a limit too low to serve one
 * session of each service refuses to start (-EMFILE, logged with the sum) instead of failing
 * later; a limit below every max_sessions is a warning: the sessions share what is left,
 * and a connection past it is refused as over max_sessions.
 */
int daemon_fds_check(struct daemon *d, const struct sluice_config *c, bool start)
{
	/* the limit may have changed since the start (prlimit): read it again */
	struct rlimit rl;
	if (!start && getrlimit(RLIMIT_NOFILE, &rl) == 0)
		d->nofile = rl.rlim_cur;
	struct fd_plan p;
	fd_plan_make(daemon_config_of(c), d->e ? engine_workers(d->e) : plan_workers(c),
		     d->fds_open, &p);
	char sum[400];
	fd_plan_format(&p, sum, sizeof(sum));
	if (start && d->nofile < (rlim_t)p.held + p.sessions_min) {
		log_error("file descriptor limit %llu is too low: sluiced holds %s, and needs "
			  "%llu more for one session of each service; raise it (systemd "
			  "LimitNOFILE=, ulimit -n) to at least %llu", (unsigned long long)d->nofile,
			  sum, (unsigned long long)p.sessions_min,
			  (unsigned long long)(p.held + p.sessions_min + 1024));
		return -EMFILE;
	}
	if (start)
		return 0; /* the engine learns it, and the warning comes, once the engine is up */
	if (p.held > d->fds_held)
		d->fds_held = p.held;
	if (d->e)
		engine_set_fds_held(d->e, d->fds_held);
	uint64_t left = d->nofile > d->fds_held ? (uint64_t)(d->nofile - d->fds_held) : 0;
	if (p.sessions_max > left) {
		char want[64] = "no limit";
		if (p.sessions_max != UINT64_MAX)
			snprintf(want, sizeof(want), "%llu", (unsigned long long)p.sessions_max);
		log_warning("file descriptor limit %llu leaves %llu descriptors for sessions "
			    "(sluiced holds %s): below what max_sessions allows (milter %u + policy "
			    "%u + intake %u x %d = %s); connections past it are refused as over "
			    "max_sessions", (unsigned long long)d->nofile, (unsigned long long)left,
			    sum, c->milter.listen.n ? c->milter.max_sessions : 0,
			    c->policy.listen.n ? c->policy.max_sessions : 0,
			    c->intake.enabled ? c->intake.max_sessions : 0, FD_PLAN_INTAKE_SESSION,
			    want);
	}
	return 0;
}

/* Raise the soft limit to the hard one, and plan; -EMFILE when too low to start. */
int daemon_fds_raise(struct daemon *d)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t want = rl.rlim_max;
		rl.rlim_cur = want;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			log_warning("cannot raise the file descriptor limit to %llu: %s",
				    (unsigned long long)want, strerror(errno));
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	d->nofile = rl.rlim_cur;
	d->fds_open = count_open_fds();
	return daemon_fds_check(d, d->cfg, true);
}

/* Once every part is up and before the first connection: the descriptors counted, plus
 * what the relay and metrics open later and the reserve, if that is more than planned. */
void daemon_fds_recount(struct daemon *d)
{
	struct fd_plan p;
	fd_plan_make(daemon_config_of(d->cfg), engine_workers(d->e), 0, &p);
	unsigned held = count_open_fds() + p.relay + p.metrics + p.reserve;
	if (held > d->fds_held) {
		log_info("file descriptors: %u held back from the sessions (counted at start), "
			 "not %u as planned", held, d->fds_held);
		d->fds_held = held;
		engine_set_fds_held(d->e, held);
	}
}
