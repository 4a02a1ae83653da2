/*
 * config_schema -- the keys of sluice.conf's blocks as data (see config_schema.h).
 *
 * Each entry is name, type, offset into struct sluice_config, default (in sluice.conf
 * syntax), bounds and one line of help; config_core.c walks them with cfg_schema_load()
 * and keeps only the checks that span several keys and the secret files.  The relay,
 * the rules and the milter's fixed answers declare their blocks' keys next to their
 * code, and src/daemon/daemon_config.c reads them.  sluice.conf(5) documents every key
 * here with the same default (test_config_keys checks both).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <syslog.h>

#include "config_schema.h"
#include "ipaddr.h"
#include "log.h"
#include "milter.h"
#include "sockspec.h"
#include "util.h"

#define OFF(field) offsetof(struct sluice_config, field)
#define DAY INT64_C(86400000)

/* enum fields are stored as int by cfg_type_enum */
_Static_assert(sizeof(enum log_target) == sizeof(int), "enum size");
_Static_assert(sizeof(enum control_admin) == sizeof(int), "enum size");
_Static_assert(sizeof(enum store_failure) == sizeof(int), "enum size");
_Static_assert(sizeof(enum intake_bare_newline) == sizeof(int), "enum size");
_Static_assert(MILTER_LEN_CAP_DEFAULT == 1052672, "milter.max_packet's default below");

/* ---- types of sluiced's own ------------------------------------------------------- */

static _Atomic bool resolve_listen_hosts;

void config_resolve_listen_hosts(bool on)
{
	resolve_listen_hosts = on;
}

bool config_resolving_listen_hosts(void)
{
	return resolve_listen_hosts;
}

/* listen = "a"; listen = ["a", "b"]; or listen repeated: socket strings (sockspec.h),
 * checked here so that sluiced -t names the line of a malformed one. */
static int listen_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			char *err, size_t el)
{
	(void)k;
	struct listen_conf *lc = field;
	for (size_t i = 0; i < lc->n; i++)
		free(lc->addr[i]);
	lc->n = 0;
	for (; n; n = cfg_next_same((struct cfg_node *)n)) {
		const struct cfg_node *items = n->kind == CFG_LIST ? n->child : n;
		for (const struct cfg_node *it = items; it; it = n->kind == CFG_LIST ? it->next : NULL) {
			const char *s;
			int r = cfg_string(it, &s, err, el);
			if (r < 0)
				return r;
			if (lc->n == CONFIG_MAX_LISTEN) {
				cfg_error(it, err, el, "more than %d addresses", CONFIG_MAX_LISTEN);
				return -EINVAL;
			}
			struct sockspec spec;
			struct sockaddr_storage ss;
			socklen_t sl;
			char why[400];
			/* a host name is looked up here too (not at a reload): sluiced -t finds
			 * one that does not resolve, with its line, rather than the start */
			if (sockspec_parse(s, &spec, why, sizeof(why)) < 0 ||
			    (!spec.numeric && config_resolving_listen_hosts() &&
			     sockspec_resolve(&spec, &ss, &sl, why, sizeof(why)) < 0)) {
				cfg_error(it, err, el, "%s", why);
				return -EINVAL;
			}
			/* libmilter's inet6 wildcard takes IPv4 clients too: an inet listener on
			 * its port beside it could never bind */
			for (size_t j = 0; j < lc->n; j++) {
				struct sockspec o;
				if (sockspec_parse(lc->addr[j], &o, why, sizeof(why)) < 0 ||
				    o.family == AF_UNIX || o.port != spec.port ||
				    o.family == spec.family || !(o.dual_stack || spec.dual_stack))
					continue;
				const struct sockspec *d = o.dual_stack ? &o : &spec;
				cfg_error(it, err, el, "\"%.100s\" takes IPv4 clients on port %u too "
					  "(as libmilter's inet6:PORT does), so \"%.100s\" cannot bind "
					  "beside it: drop the inet one, or write inet6:[::]:%u for IPv6 "
					  "only", d->text, (unsigned)spec.port,
					  d == &o ? s : lc->addr[j], (unsigned)spec.port);
				return -EINVAL;
			}
			if (!(lc->addr[lc->n++] = strdup(s)))
				return -ENOMEM;
		}
	}
	return 0;
}

static bool listen_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const struct listen_conf *lc = field;
	if (!lc->n)
		return false;
	size_t o = (size_t)snprintf(buf, size, "[");
	for (size_t i = 0; i < lc->n && o < size; i++) {
		char q[512];
		o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? ", " : "",
				      cfg_quote(lc->addr[i], q, sizeof(q)));
	}
	if (o < size)
		snprintf(buf + o, size - o, "]");
	return true;
}

static const struct cfg_type type_listen = { "addresses", listen_parse, listen_format, NULL };

/* allow = ["127.0.0.0/8", "::1"]: networks, each ADDR or ADDR/BITS. */
struct prefixes {
	struct ip_prefix *p;
	size_t n;
};
_Static_assert(offsetof(struct sluice_config, intake.nallow) ==
	       offsetof(struct sluice_config, intake.allow) + offsetof(struct prefixes, n),
	       "intake.allow and nallow read as struct prefixes");

static int prefixes_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			  char *err, size_t el)
{
	char **list = NULL;
	int r = cfg_type_list.parse(n, k, &list, err, el);
	if (r < 0)
		return r;
	size_t count = 0;
	while (list[count])
		count++;
	struct ip_prefix *p = calloc(count ? count : 1, sizeof(*p));
	if (!p)
		r = -ENOMEM;
	for (size_t i = 0; r == 0 && i < count; i++)
		if (ipaddr_parse_prefix(str_cstr(list[i]), &p[i].addr, &p[i].bits) < 0) {
			cfg_error(n, err, el, "\"%.100s\": expected an address or a network "
				  "(ADDR/BITS)", list[i]);
			r = -EINVAL;
		}
	cfg_type_list.clear(&list);
	if (r < 0) {
		free(p);
		return r;
	}
	struct prefixes *ps = field;
	free(ps->p);
	ps->p = p;
	ps->n = count;
	return 0;
}

static bool prefixes_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	const struct prefixes *ps = field;
	size_t o = (size_t)snprintf(buf, size, "[");
	for (size_t i = 0; i < ps->n && o < size; i++) {
		char a[INET6_ADDRSTRLEN + 8];
		ipaddr_format(&ps->p[i].addr, ps->p[i].bits, a, sizeof(a));
		o += (size_t)snprintf(buf + o, size - o, "%s\"%s\"", i ? ", " : "", a);
	}
	if (o < size)
		snprintf(buf + o, size - o, "]");
	return true;
}

static const struct cfg_type type_prefixes = { "networks", prefixes_parse, prefixes_format, NULL };

static const char *const facilities[] = { "mail", "daemon", "user", "local0", "local1",
					  "local2", "local3", "local4", "local5", "local6",
					  "local7", "auth", "authpriv", "news", "uucp", "cron",
					  "syslog", "lpr", "kern", "ftp" };

static int facility_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
			  char *err, size_t el)
{
	(void)k;
	const char *s;
	int r = cfg_string(n, &s, err, el);
	if (r == 0 && !*s) {
		cfg_error(n, err, el, "must not be empty");
		r = -EINVAL;
	}
	if (r == 0 && log_facility_from_name(s, field) < 0) {
		cfg_error(n, err, el, "unknown syslog facility \"%.50s\"", s);
		r = -EINVAL;
	}
	return r;
}

static bool facility_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	for (size_t i = 0; i < ARRAY_SIZE(facilities); i++) {
		int v;
		if (log_facility_from_name(facilities[i], &v) == 0 && v == *(const int *)field) {
			snprintf(buf, size, "\"%s\"", facilities[i]);
			return true;
		}
	}
	return false;
}

static const struct cfg_type type_facility = { "facility", facility_parse, facility_format, NULL };

static int level_parse(const struct cfg_node *n, const struct cfg_key *k, void *field,
		       char *err, size_t el)
{
	(void)k;
	const char *s;
	int r = cfg_string(n, &s, err, el);
	if (r == 0 && !*s) {
		cfg_error(n, err, el, "must not be empty");
		r = -EINVAL;
	}
	if (r == 0 && log_level_from_name(s, field) < 0) {
		cfg_error(n, err, el, "expected debug, info, notice, warning or error");
		r = -EINVAL;
	}
	return r;
}

static bool level_format(const struct cfg_key *k, const void *field, char *buf, size_t size)
{
	(void)k;
	snprintf(buf, size, "\"%s\"", log_level_name(*(const enum log_level *)field));
	return true;
}

static const struct cfg_type type_level = { "level", level_parse, level_format, NULL };

/* ---- checks of one key -------------------------------------------------------------- */

static int check_no_space(const struct cfg_node *n, const void *field, char *err, size_t el)
{
	const char *s = *(char *const *)field;
	if (s && strpbrk(s, " \t\r\n")) {
		cfg_error(n, err, el, "a host name has no spaces");
		return -EINVAL;
	}
	return 0;
}

/* ---- the tables ---------------------------------------------------------------------- */

#define END { .name = NULL }

const struct cfg_key config_root_keys[] = {
	{ "workers", &cfg_type_uint, OFF(workers), NULL, 0, 256,
	  .help = "worker threads; 0 or unset: one per CPU",
	  .restart = CONFIG_RESTART_WORKERS },
	{ "stats_interval", &cfg_type_duration, OFF(stats_interval_ms), "5m", 0, DAY,
	  .help = "how often counters are logged; 0: never" },
	{ "shutdown_timeout", &cfg_type_duration, OFF(shutdown_timeout_ms), "30s", 0, 3600000,
	  .help = "how long sessions may drain on SIGTERM" },
	{ "pid_file", &cfg_type_string, OFF(pid_file), NULL, .help = "written by sluiced -d" },
	{ "user", &cfg_type_string, OFF(user), NULL,
	  .help = "the user privileges are dropped to after binding",
	  .restart = CONFIG_RESTART_USER },
	{ "group", &cfg_type_string, OFF(group), NULL,
	  .help = "the group (default: the user's primary group)",
	  .restart = CONFIG_RESTART_USER },
	{ "state_dir", &cfg_type_string, OFF(state_dir), "/var/lib/sluice",
	  .help = "snapshots of the limits and the lanes' history",
	  .restart = CONFIG_RESTART_STATE_DIR },
	END,
};

static const struct cfg_enum log_targets[] = {
	{ "stderr", LOG_TARGET_STDERR }, { "syslog", LOG_TARGET_SYSLOG }, { NULL, 0 },
};

const struct cfg_key config_log_keys[] = {
	{ "target", &cfg_type_enum, OFF(log.target), "stderr", .names = log_targets,
	  .help = "where log lines go" },
	{ "facility", &type_facility, OFF(log.facility), "mail", .help = "the syslog facility" },
	{ "level", &type_level, OFF(log.level), "info", .help = "the least severe level logged" },
	END,
};

static const struct cfg_enum admins[] = {
	{ "group", CONTROL_ADMIN_GROUP }, { "root", CONTROL_ADMIN_ROOT }, { NULL, 0 },
};

const struct cfg_key config_control_keys[] = {
	{ "listen", &type_listen, OFF(control), NULL, .flags = CFG_REQUIRED | CFG_REPEAT,
	  .help = "the control socket(s)",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "mode", &cfg_type_mode, OFF(control.mode), "0660", .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "owner", &cfg_type_user, OFF(control.owner), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "group", &cfg_type_group, OFF(control.group), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "admin", &cfg_type_enum, OFF(control_admin), "group", .names = admins,
	  .help = "who may change state: every peer let in (group), or root and sluiced's user" },
	{ "allow_remote", &cfg_type_bool, OFF(control_allow_remote), "false",
	  .help = "listen on an inet address other hosts reach (the password crosses it in "
		  "clear)" },
	{ "password_file", &cfg_type_string, OFF(control_password_file), NULL,
	  .help = "the password of an inet listen address: every command (a secret file)" },
	{ "read_password_file", &cfg_type_string, OFF(control_read_password_file), NULL,
	  .help = "a second one, for the commands that change nothing (a secret file)" },
	END,
};

const struct cfg_key config_metrics_keys[] = {
	{ "listen", &cfg_type_string, OFF(metrics.listen), "inet:127.0.0.1:9187",
	  .help = "the Prometheus endpoint",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "allow_remote", &cfg_type_bool, OFF(metrics.allow_remote), "false",
	  .help = "listen on an address other hosts reach (no authentication)" },
	{ "max_connections", &cfg_type_uint, OFF(metrics.max_connections), "4", 1, 1024,
	  .help = "scrapers served at once",
	  .restart = CONFIG_RESTART_LISTEN },
	END,
};

const struct cfg_key config_milter_keys[] = {
	{ "listen", &type_listen, OFF(milter.listen), NULL, .flags = CFG_REQUIRED | CFG_REPEAT,
	  .help = "the milter socket(s)",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "mode", &cfg_type_mode, OFF(milter.listen.mode), "0660", .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "owner", &cfg_type_user, OFF(milter.listen.owner), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "group", &cfg_type_group, OFF(milter.listen.group), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "max_sessions", &cfg_type_uint, OFF(milter.max_sessions), "10000", 0, 10000000,
	  .help = "MTA connections at once" },
	{ "idle_timeout", &cfg_type_duration, OFF(milter.idle_timeout_ms), "2h", 1000, 7 * DAY,
	  .help = "a session waiting for the MTA's next command" },
	{ "command_timeout", &cfg_type_duration, OFF(milter.command_timeout_ms), "5m", 100, DAY,
	  .help = "a packet under way" },
	{ "max_packet", &cfg_type_size, OFF(milter.max_packet), "1052672", 65536 + 1, 64 << 20,
	  .help = "the largest milter packet accepted" },
	END,
};

const struct cfg_key config_policy_keys[] = {
	{ "listen", &type_listen, OFF(policy.listen), NULL, .flags = CFG_REQUIRED | CFG_REPEAT,
	  .help = "the policy socket(s)",
	  .restart = CONFIG_RESTART_LISTEN },
	/* Postfix's smtpd runs as postfix, not as sluice */
	{ "mode", &cfg_type_mode, OFF(policy.listen.mode), "0666", .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "owner", &cfg_type_user, OFF(policy.listen.owner), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "group", &cfg_type_group, OFF(policy.listen.group), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "max_sessions", &cfg_type_uint, OFF(policy.max_sessions), "1000", 0, 10000000,
	  .help = "Postfix connections at once" },
	{ "idle_timeout", &cfg_type_duration, OFF(policy.idle_timeout_ms), "1h", 1000, 7 * DAY,
	  .help = "a connection waiting for the next request" },
	{ "command_timeout", &cfg_type_duration, OFF(policy.command_timeout_ms), "1m", 100, DAY,
	  .help = "a request under way" },
	{ "max_request", &cfg_type_size, OFF(policy.max_request), "65536", 1024, 1 << 20,
	  .help = "the largest request accepted" },
	END,
};

static const struct cfg_enum bare_newlines[] = {
	{ "normalize", INTAKE_BARE_NORMALIZE }, { "reject", INTAKE_BARE_REJECT }, { NULL, 0 },
};

const struct cfg_key config_intake_keys[] = {
	{ "listen", &type_listen, OFF(intake.listen), NULL, .flags = CFG_REQUIRED | CFG_REPEAT,
	  .help = "the SMTP socket(s)",
	  .restart = CONFIG_RESTART_LISTEN },
	/* local programs inject; allow does not apply to unix: */
	{ "mode", &cfg_type_mode, OFF(intake.listen.mode), "0666", .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "owner", &cfg_type_user, OFF(intake.listen.owner), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "group", &cfg_type_group, OFF(intake.listen.group), NULL, .help = "of a unix socket",
	  .restart = CONFIG_RESTART_LISTEN },
	{ "allow", &type_prefixes, OFF(intake.allow), "127.0.0.0/8", .flags = CFG_REPEAT,
	  .help = "clients that may queue mail (default 127.0.0.0/8 and ::1)" },
	{ "max_sessions", &cfg_type_uint, OFF(intake.max_sessions), "1000", 1, 1000000,
	  .help = "SMTP sessions at once" },
	{ "idle_timeout", &cfg_type_duration, OFF(intake.idle_timeout_ms), "5m", 1000, DAY,
	  .help = "waiting for the next command" },
	{ "command_timeout", &cfg_type_duration, OFF(intake.command_timeout_ms), "5m", 1000, DAY,
	  .help = "a command line, from its first byte to its end" },
	{ "data_timeout", &cfg_type_duration, OFF(intake.data_timeout_ms), "1h", 1000, DAY,
	  .help = "a message's data in all, from 354 to the final dot" },
	{ "data_min_rate", &cfg_type_size, OFF(intake.data_min_rate), "1KiB", 0,
	  INT64_C(1) << 30, .help = "bytes a second that earn data time past command_timeout; "
	  "0: data_timeout alone" },
	{ "max_message_size", &cfg_type_size, OFF(intake.max_message_size), "50MiB", 1024,
	  INT64_C(1) << 40, .help = "552 5.3.4 past it; advertised in EHLO SIZE" },
	{ "max_recipients", &cfg_type_uint, OFF(intake.max_recipients), "1000", 1, 1000000,
	  .help = "452 4.5.3 past it" },
	{ "max_errors", &cfg_type_uint, OFF(intake.max_errors), "20", 1, 1000,
	  .help = "bad commands before the session is closed" },
	{ "max_line_length", &cfg_type_size, OFF(intake.max_line_length), "998", 78, 1 << 30,
	  .help = "octets of a message line, CRLF excluded (RFC 5321 4.5.3.1.6)" },
	{ "bare_newline", &cfg_type_enum, OFF(intake.bare_newline), "normalize",
	  .names = bare_newlines, .flags = CFG_QUOTE,
	  .help = "DATA's bare LF or CR: stored as CRLF, or the message refused (550 5.5.2)" },
	{ "hostname", &cfg_type_string, OFF(intake.hostname), NULL, .check = check_no_space,
	  .help = "in the greeting and Received: (default: the host's name)" },
	END,
};

const struct cfg_key config_queue_keys[] = {
	{ "dir", &cfg_type_string, OFF(queue.dir), "/var/spool/sluice", .help = "the queue",
	  .restart = CONFIG_RESTART_QUEUE },
	{ "commit_batch", &cfg_type_uint, OFF(queue.commit_batch), "256", 1, 65536,
	  .help = "messages flushed together at most",
	  .restart = CONFIG_RESTART_QUEUE },
	{ "lifetime", &cfg_type_duration, OFF(queue.lifetime_ms), "5d", 1000, 365 * DAY,
	  .help = "a message's time in the queue before it bounces" },
	{ "min_free", &cfg_type_size, OFF(queue.min_free), "10MiB", 0, INT64_C(1) << 40,
	  .help = "bytes kept free: MAIL is refused with 452 4.3.1 below it" },
	END,
};

static const struct cfg_enum store_types[] = {
	{ "memory", 0 }, { "redis", 1 }, { NULL, 0 },
};

const struct cfg_key config_store_keys[] = {
	{ "type", &cfg_type_enum, OFF(store.type), "memory", .names = store_types,
	  .flags = CFG_QUOTE, .help = "where the limits' counters live",
	  .restart = CONFIG_RESTART_STORE },
	{ "max_keys", &cfg_type_uint64, OFF(store.max_keys), "1000000", 1000, 1000000000,
	  .help = "keys held in memory at most" },
	{ "snapshot_interval", &cfg_type_duration, OFF(store.snapshot_interval_ms), "5m", 0, DAY,
	  .help = "how often the memory store is saved; 0: only at shutdown" },
	{ "overrides_check", &cfg_type_duration, OFF(store.overrides_check_ms), "5s", 1000,
	  3600000, .help = "how often overrides files are checked" },
	END,
};

static bool is_redis(const void *base)
{
	return ((const struct sluice_config *)base)->store.type == 1;
}

static const struct cfg_enum failures[] = {
	{ "local", STORE_FAIL_LOCAL }, { "accept", STORE_FAIL_ACCEPT },
	{ "tempfail", STORE_FAIL_TEMPFAIL }, { NULL, 0 },
};

/* the keys of type = "redis" only */
const struct cfg_key config_redis_keys[] = {
	{ "server", &cfg_type_string, OFF(store.server), NULL, .active = is_redis,
	  .help = "host:port or unix:/path of Redis (default 127.0.0.1:6379)",
	  .restart = CONFIG_RESTART_STORE },
	{ "user", &cfg_type_string, OFF(store.user), NULL, .active = is_redis,
	  .help = "the ACL user",
	  .restart = CONFIG_RESTART_STORE },
	{ "password", &cfg_type_string, OFF(store.password), NULL, .flags = CFG_SECRET,
	  .active = is_redis,
	  .help = "the password (then sluice.conf must be a secret file); never printed",
	  .restart = CONFIG_RESTART_STORE },
	{ "password_file", &cfg_type_string, OFF(store.password_file), NULL, .active = is_redis,
	  .help = "a file whose first line is the password" },
	{ "db", &cfg_type_uint, OFF(store.db), "0", 0, 1000000, .active = is_redis,
	  .help = "the database number",
	  .restart = CONFIG_RESTART_STORE },
	{ "prefix", &cfg_type_string, OFF(store.prefix), NULL, .active = is_redis,
	  .help = "put before every key",
	  .restart = CONFIG_RESTART_STORE },
	{ "timeout", &cfg_type_duration, OFF(store.timeout_ms), "50ms", 1, 60000,
	  .active = is_redis, .help = "a command's reply, else on_failure applies",
	  .restart = CONFIG_RESTART_STORE },
	{ "sentinels", &cfg_type_list, OFF(store.sentinels), NULL, .flags = CFG_REPEAT,
	  .active = is_redis, .help = "Sentinel addresses, with master_name",
	  .restart = CONFIG_RESTART_STORE },
	{ "master_name", &cfg_type_string, OFF(store.master_name), NULL, .active = is_redis,
	  .help = "the master the sentinels watch",
	  .restart = CONFIG_RESTART_STORE },
	{ "cluster", &cfg_type_list, OFF(store.cluster), NULL, .flags = CFG_REPEAT,
	  .active = is_redis, .help = "seed nodes of a Redis Cluster (host:port each)",
	  .restart = CONFIG_RESTART_STORE },
	{ "on_failure", &cfg_type_enum, OFF(store.on_failure), "local", .names = failures,
	  .active = is_redis, .help = "what a decision does when Redis does not answer",
	  .restart = CONFIG_RESTART_STORE },
	{ "nodes", &cfg_type_uint, OFF(store.nodes), "1", 1, 1000, .active = is_redis,
	  .help = "nodes sharing the limits (on_failure = local enforces limit / nodes)",
	  .restart = CONFIG_RESTART_STORE },
	{ "node", &cfg_type_string, OFF(store.node), NULL, .active = is_redis,
	  .help = "this node's name (default: the host's)",
	  .restart = CONFIG_RESTART_STORE },
	{ "lease", &cfg_type_duration, OFF(store.lease_ms), "15s", 1000, 3600000,
	  .active = is_redis, .help = "how long a node's membership lasts unrenewed",
	  .restart = CONFIG_RESTART_STORE },
	END,
};

static bool has_metrics(const struct sluice_config *c)
{
	return c->metrics.enabled;
}

static bool has_control(const struct sluice_config *c)
{
	return c->control.n > 0;
}

static bool has_milter(const struct sluice_config *c)
{
	return c->milter.listen.n > 0;
}

static bool has_policy(const struct sluice_config *c)
{
	return c->policy.listen.n > 0;
}

static bool has_intake(const struct sluice_config *c)
{
	return c->intake.enabled;
}

const struct config_block config_blocks[] = {
	{ "", config_root_keys, NULL, CONFIG_RESTART_NONE },
	{ "log", config_log_keys, NULL, CONFIG_RESTART_NONE },
	{ "control", config_control_keys, has_control, CONFIG_RESTART_LISTEN },
	{ "metrics", config_metrics_keys, has_metrics, CONFIG_RESTART_LISTEN },
	{ "milter", config_milter_keys, has_milter, CONFIG_RESTART_LISTEN },
	{ "policy", config_policy_keys, has_policy, CONFIG_RESTART_LISTEN },
	{ "intake", config_intake_keys, has_intake, CONFIG_RESTART_LISTEN },
	{ "queue", config_queue_keys, NULL, CONFIG_RESTART_NONE },
	{ "store", config_store_keys, NULL, CONFIG_RESTART_NONE },
	{ "store", config_redis_keys, NULL, CONFIG_RESTART_NONE },
	{ NULL, NULL, NULL, CONFIG_RESTART_NONE },
};

unsigned config_restart_changes(const struct sluice_config *old, const struct sluice_config *nc)
{
	unsigned groups = 0;
	for (const struct config_block *b = config_blocks; b->name; b++) {
		groups |= cfg_schema_restarts(b->keys, old, nc);
		if (b->present && b->present(old) != b->present(nc))
			groups |= 1u << b->restart;
	}
	return groups & ~(1u << CONFIG_RESTART_NONE);
}

const char *config_restart_text(enum config_restart g)
{
	static const char *const text[CONFIG_RESTART_COUNT] = {
		[CONFIG_RESTART_USER] = "user or group changed; they take effect at the next "
					"restart",
		[CONFIG_RESTART_LISTEN] = "listen addresses changed; they take effect at the next "
					  "restart",
		[CONFIG_RESTART_WORKERS] = "workers changed; it takes effect at the next restart",
		[CONFIG_RESTART_STATE_DIR] = "state_dir changed; it takes effect at the next "
					     "restart",
		[CONFIG_RESTART_STORE] = "store settings changed; they take effect at the next "
					 "restart",
		[CONFIG_RESTART_QUEUE] = "queue settings changed; they take effect at the next "
					 "restart",
	};
	return (unsigned)g < CONFIG_RESTART_COUNT && text[g] ? text[g] : "?";
}

int config_init(struct sluice_config *c)
{
	struct listen_conf *all[] = { &c->control, &c->milter.listen, &c->policy.listen,
				      &c->intake.listen };
	for (size_t i = 0; i < ARRAY_SIZE(all); i++) {
		all[i]->owner = (uid_t)-1;
		all[i]->group = (gid_t)-1;
	}
	for (const struct config_block *b = config_blocks; b->name; b++) {
		int r = cfg_schema_defaults(b->keys, c);
		if (r < 0)
			return r;
	}
	/* allow's default is two networks */
	struct ip_prefix *p = realloc(c->intake.allow, 2 * sizeof(*p));
	if (!p)
		return -ENOMEM;
	c->intake.allow = p;
	ipaddr_parse_prefix(str_cstr("::1"), &p[1].addr, &p[1].bits);
	c->intake.nallow = 2;
	return 0;
}
