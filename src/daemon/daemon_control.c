/*
 * daemon_control -- what each control command runs: the one table binding every command
 * of control_cmds.h that the daemon answers to its handler, checked against that table at
 * start (daemon_control_check()), and the handlers of the commands about the daemon
 * itself: status, stats, decisions, top, reload and help.  The handlers of limits and
 * test (policy_control.c), queue (queue_control.c) and lanes (relay_control.c) are
 * theirs; the table binds them with a line each.
 *
 * Handlers run on a control session's worker: they read the running configuration under
 * cfg_lock and never load or block; `reload` asks the main thread (reload.c) and answers
 * once it is done.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "build_config.h"
#include "control_cmds.h"
#include "daemon_int.h"
#include "engine.h"
#include "live_sessions.h"
#include "log.h"
#include "policy_control.h"
#include "queue.h"
#include "queue_control.h"
#include "relay.h"
#include "relay_control.h"
#include "stats.h"
#include "store.h"
#include "util.h"

/*
 * `top`: one snapshot for `sluice top` in lines the command parses, one record a line:
 *   time UNIX_SECONDS
 *   svc NAME CURRENT PEAK CONNECTIONS
 *   rule NAME STAGE ACTION PASSED OVER
 *   key TEXT (the keys nearest their limits) | keys-shared
 *   queue MESSAGES HELD RECIPIENTS OLDEST_SECONDS
 *   relay DELIVERED DEFERRED FAILED SUSPENSIONS
 *   lanes COUNT, then lane TEXT (at most 8, suspended and busy ones first)
 * A reader skips the records it does not know.
 */
static void daemon_control_top(struct daemon *d, struct policy *p, struct buf *out)
{
	buf_printf(out, "time %.3f\n", (double)realtime_ns() / 1e9);
	for (size_t i = 0; engine_service(d->e, i); i++) {
		struct service_stats st;
		service_stats(engine_service(d->e, i), false, &st);
		buf_printf(out, "svc %s %llu %llu %llu\n", st.name, (unsigned long long)st.current,
			   (unsigned long long)st.peak, (unsigned long long)st.total.connections);
	}
	policy_control_top(p, 5, out);
	if (d->queue) {
		struct queue_stats qs;
		queue_stats(d->queue, &qs);
		double age = qs.oldest_us ? (double)(realtime_ns() / 1000 - qs.oldest_us) / 1e6 : 0;
		buf_printf(out, "queue %" PRIu64 " %" PRIu64 " %" PRIu64 " %.0f\n", qs.messages,
			   qs.held, qs.recipients, age);
	}
	if (d->relay) {
		struct relay_stats rs;
		relay_stats(d->relay, &rs);
		buf_printf(out, "relay %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
			   rs.delivered, rs.deferred, rs.failed, rs.suspensions);
		relay_lanes_brief(d->relay, 8, out);
	}
}

/* ---- control commands: the handlers of control_cmds.h's rows ---- */

/* A handler: 0 (answered in out), 1 (answers later through w), 2 (a stream), or <0. */
typedef int control_fn(struct daemon *d, size_t argc, const struct str *argv, bool json,
		       struct buf *out, bool *ret_ok, struct control_wait *w);

static int cmd_stats(struct daemon *d, size_t argc, const struct str *argv, bool json,
		     struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)w;
	/* exactly the table's two forms: the access check took "stats --reset" for the
	 * form that changes state by position, so no other word may reset here */
	bool reset = false;
	for (size_t i = 1; i < argc; i++) {
		if (str_eq_cstr(argv[i], "--reset")) {
			reset = true;
		} else if (!str_eq_cstr(argv[i], "--json") && !str_eq_cstr(argv[i], "json")) {
			buf_append_cstr(out, "usage: stats [--reset] [--json]\n");
			*ret_ok = false;
			return 0;
		}
	}
	if (reset) {
		/* the interval ends here, as at a tick: its lines go to the log too */
		log_notice("stats: interval ended by the control command");
		daemon_timers_stats(d, true);
	}
	struct service_stats sts[16];
	size_t n = 0;
	for (; n < ARRAY_SIZE(sts) && engine_service(d->e, n); n++)
		service_stats(engine_service(d->e, n), false, &sts[n]);
	if (json) {
		buf_append_byte(out, '{');
		for (size_t i = 0; i < n; i++) {
			if (i)
				buf_append_byte(out, ',');
			service_stats_json(out, &sts[i]);
		}
	} else {
		service_stats_format(out, sts, n);
		buf_append_byte(out, '\n');
	}
	struct policy *p = daemon_services_rules(d);
	if (json)
		buf_append_byte(out, ',');
	policy_control_stats(p, d->store, json, out);
	policy_unref(p);
	queue_control_stats(d->queue, d->intake, json, out);
	relay_control_stats(d->relay, json, out);
	if (json)
		buf_append_cstr(out, "}\n");
	*ret_ok = true;
	return 0;
}

static int cmd_decisions(struct daemon *d, size_t argc, const struct str *argv, bool json,
			 struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)argc;
	(void)argv;
	(void)w;
	struct policy *p = daemon_services_rules(d);
	policy_control_decisions(p, json, out);
	policy_unref(p);
	*ret_ok = true;
	return 0;
}

static int cmd_top(struct daemon *d, size_t argc, const struct str *argv, bool json,
		   struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)argc;
	(void)argv;
	(void)json;
	(void)w;
	struct policy *p = daemon_services_rules(d);
	daemon_control_top(d, p, out);
	policy_unref(p);
	*ret_ok = true;
	return 0;
}

static int cmd_status(struct daemon *d, size_t argc, const struct str *argv, bool json,
		      struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)argc;
	(void)argv;
	(void)w;
	pthread_mutex_lock(&d->cfg_lock);
	const char *path = d->cfg->path;
	double up = (double)(now_ms() - d->started_ms) / 1000.0;
	struct store_stats ss;
	d->store->ops->stats(d->store->ctx, &ss);
	char store[200];
	if (ss.shared)
		fmt_fixed(store, sizeof(store), "%s, %s", d->store->type, ss.state);
	else
		fmt_fixed(store, sizeof(store), "%s", d->store->type);
	if (json) {
		buf_printf(out,
			   "{\"version\":\"%s\",\"pid\":%ld,\"uptime\":%.0f,\"workers\":%u,"
			   "\"sessions\":%u,\"reloads\":%lu,\"stopping\":%s,"
			   "\"nofile\":%llu,\"store\":{\"type\":\"%s\",\"up\":%s,\"state\":",
			   SLUICE_VERSION, (long)getpid(), up, engine_workers(d->e),
			   engine_sessions(d->e), d->reloads, d->stopping ? "true" : "false",
			   (unsigned long long)d->nofile, d->store->type,
			   !ss.shared || ss.up ? "true" : "false");
		/* the state quotes Redis's error text */
		buf_append_json_string(out, ss.shared ? ss.state : "memory");
		buf_append_byte(out, '}');
		/* SMTP sessions the policy service was asked about while the milter served
		 * them: one MTA uses both, and counts each event twice */
		buf_printf(out, ",\"double_use\":%llu", (unsigned long long)live_sessions_doubles());
		queue_control_status(d->queue, true, out);
		buf_append_cstr(out, "}\n");
	} else {
		buf_printf(out,
			   "sluiced %s running, pid %ld, up %.0f s\n"
			   "configuration: %s (reloaded %lu times)\n"
			   "workers: %u, sessions open: %u, file descriptor limit: %llu\n"
			   "store: %s%s\n",
			   SLUICE_VERSION, (long)getpid(), up, path, d->reloads,
			   engine_workers(d->e), engine_sessions(d->e),
			   (unsigned long long)d->nofile, store, d->stopping ? "\nstopping" : "");
		uint64_t doubles = live_sessions_doubles();
		if (doubles)
			buf_printf(out, "double use: the milter and the policy service see the same "
				   "SMTP sessions (%llu seen): each event is counted by both\n",
				   (unsigned long long)doubles);
		queue_control_status(d->queue, false, out);
	}
	pthread_mutex_unlock(&d->cfg_lock);
	*ret_ok = true;
	return 0;
}

static int cmd_reload(struct daemon *d, size_t argc, const struct str *argv, bool json,
		      struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)argc;
	(void)argv;
	(void)json;
	/* the main thread loads the file, as on SIGHUP, and answers when it is done */
	return reload_ask(d, out, ret_ok, w);
}

static int cmd_limits(struct daemon *d, size_t argc, const struct str *argv, bool json,
		      struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)json;
	/* the command holds its own reference while it waits */
	struct policy *p = daemon_services_rules(d);
	int r = policy_control_limits(p, argc, argv, out, ret_ok, w);
	policy_unref(p);
	return r;
}

static int cmd_test(struct daemon *d, size_t argc, const struct str *argv, bool json,
		    struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)json;
	struct policy *p = daemon_services_rules(d);
	int r = policy_control_test(p, argc, argv, out, ret_ok, w);
	policy_unref(p);
	return r;
}

static int cmd_queue(struct daemon *d, size_t argc, const struct str *argv, bool json,
		     struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)json;
	return queue_control(d->queue, argc, argv, out, ret_ok, w);
}

static int cmd_lanes(struct daemon *d, size_t argc, const struct str *argv, bool json,
		     struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)json;
	(void)w;
	relay_control(d->relay, argc, argv, out, ret_ok);
	return 0;
}

static int cmd_help(struct daemon *d, size_t argc, const struct str *argv, bool json,
		    struct buf *out, bool *ret_ok, struct control_wait *w)
{
	(void)d;
	(void)argc;
	(void)argv;
	(void)json;
	(void)w;
	buf_append_cstr(out, "commands:\n");
	*ret_ok = control_cmds_help(out, false) == 0;
	return 0;
}

/* The handler of each command that control_cmds.h lists for the daemon. */
static const struct {
	const char *name;
	control_fn *fn;
} handlers[] = {
	{ "status", cmd_status }, { "stats", cmd_stats }, { "decisions", cmd_decisions },
	{ "top", cmd_top }, { "reload", cmd_reload }, { "limits", cmd_limits },
	{ "test", cmd_test }, { "queue", cmd_queue }, { "lanes", cmd_lanes },
	{ "help", cmd_help },
};

int daemon_control_check(char *err, size_t errlen)
{
	for (size_t i = 0; i < control_ncmds; i++) {
		const struct control_cmd *c = &control_cmds[i];
		bool found = false;
		for (size_t h = 0; h < ARRAY_SIZE(handlers); h++)
			found |= strcmp(handlers[h].name, c->name) == 0;
		if (found == !!(c->flags & CONTROL_CMD_LOCAL)) {
			fmt_fixed(err, errlen, "control command \"%s\": %s", c->name,
				  found ? "run by sluice, yet the daemon has a handler"
					: "no handler in the daemon");
			return -EINVAL;
		}
	}
	for (size_t h = 0; h < ARRAY_SIZE(handlers); h++) {
		if (!control_cmd_known(str_cstr(handlers[h].name))) {
			fmt_fixed(err, errlen, "control handler \"%s\" is not in the command table",
				  handlers[h].name);
			return -EINVAL;
		}
	}
	return 0;
}

static int daemon_control_run(void *arg, size_t argc, const struct str *argv, struct buf *out,
			      bool *ret_ok, struct control_wait *w)
{
	struct daemon *d = arg;
	bool json = false;
	for (size_t i = 1; i < argc; i++)
		if (str_eq_cstr(argv[i], "--json") || str_eq_cstr(argv[i], "json"))
			json = true;
	for (size_t h = 0; h < ARRAY_SIZE(handlers); h++)
		if (str_eq_cstr(argv[0], handlers[h].name))
			return handlers[h].fn(d, argc, argv, json, out, ret_ok, w);
	char q[128];
	buf_printf(out, "unknown command \"%s\" (try help)\n", log_quote(q, sizeof(q), argv[0], 40));
	*ret_ok = false;
	return 0;
}

static bool daemon_control_admin_root(void *arg)
{
	struct daemon *d = arg;
	pthread_mutex_lock(&d->cfg_lock);
	bool r = d->cfg->control_admin == CONTROL_ADMIN_ROOT;
	pthread_mutex_unlock(&d->cfg_lock);
	return r;
}

static enum control_access daemon_control_password(void *arg, struct str secret)
{
	struct daemon *d = arg;
	pthread_mutex_lock(&d->cfg_lock);
	const char *admin = d->cfg->control_password, *read = d->cfg->control_read_password;
	/* both compared, each in constant time (daemon_config_load() made them differ) */
	bool is_admin = admin && secret_equal(secret, str_cstr(admin));
	bool is_read = read && secret_equal(secret, str_cstr(read));
	pthread_mutex_unlock(&d->cfg_lock);
	return is_admin ? CONTROL_ACCESS_ADMIN : is_read ? CONTROL_ACCESS_READ
						       : CONTROL_ACCESS_DENIED;
}

static bool daemon_control_stopping(void *arg)
{
	const struct daemon *d = arg;
	return __atomic_load_n(&d->stopping, __ATOMIC_RELAXED);
}

struct control_owner daemon_control_owner(struct daemon *d)
{
	return (struct control_owner){ .run = daemon_control_run,
				       .admin_root = daemon_control_admin_root,
				       .password_access = daemon_control_password,
				       .stopping = daemon_control_stopping, .arg = d };
}
