/*
 * daemon -- sluiced's program shell (see sluiced(8)): the skeleton every part runs in,
 * in the manner of Postfix's trigger_server_main().
 *
 * Start: load the configuration (all errors name file, line and key), raise the file
 * descriptor limit (daemon_fds.c); as root, make the directories and bind every listener,
 * then drop to the configured user (privs.c) before anything else is opened; open the
 * store, the queue and the relay, make the services (each given its part of the
 * configuration by daemon_services.c), detach and write the pid file when asked,
 * start the fixed worker pool and the timers (daemon_timers.c), tell systemd it is ready
 * (notify.c), then run the main loop.  SIGHUP reloads (reload.c: a new configuration is
 * built beside the running one and swapped in only if it loads completely).
 * SIGTERM/SIGINT stop accepting and let sessions drain until shutdown_timeout, then
 * close what remains.  The control commands are daemon_control.c's.
 */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "build_config.h"
#include "config.h"
#include "config_schema.h"
#include "daemon_int.h"
#include "engine.h"
#include "listen.h"
#include "metrics.h"
#include "metrics_render.h"
#include "milter_session.h"
#include "notify.h"
#include "privs.h"
#include "pfpolicy_service.h"
#include "intake_service.h"
#include "queue.h"
#include "relay.h"
#include "store.h"
#include "util.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sluiced [-c FILE] [-t | -n | -D] [-d [-p PIDFILE]]\n"
		"  -c FILE   configuration file (default %s)\n"
		"  -t        check the configuration and exit (0 ok, 1 error)\n"
		"  -n        print the settings that differ from their defaults, and exit\n"
		"  -D        print every effective setting, and exit\n"
		"  -d        detach into the background (default: run in the foreground)\n"
		"  -p FILE   pid file written with -d (default: pid_file from the configuration)\n"
		"  -V        print the version\n",
		CONFIG_DEFAULT_PATH);
}

/* Recovery's findings, one log line each (doc/QUEUE.md). */
static void queue_report(void *arg, const struct queue_recover_event *ev)
{
	(void)arg;
	/* names come from the directory: any bytes */
	char n[80], dest[80], why[200];
	log_quote(n, sizeof(n), str_cstr(ev->name), 60);
	log_quote(dest, sizeof(dest), str_cstr(ev->dest ? ev->dest : ev->name), 60);
	log_quote(why, sizeof(why), str_cstr(ev->reason ? ev->reason : ""), 150);
	switch (ev->what) {
	case QUEUE_RECOVER_TMP_REMOVED:
		log_info("queue: removed tmp/%s (a message never acknowledged)", n);
		break;
	case QUEUE_RECOVER_CORRUPT:
		log_error("queue: %s moved to corrupt/%s: %s", n, dest, why);
		break;
	case QUEUE_RECOVER_UNCERTAIN:
		log_warning("queue: %s: %zu recipients uncertain after a crash, will be retried",
			    n, ev->count);
		break;
	case QUEUE_RECOVER_BOUNCE_MARKED:
		log_notice("queue: %s: a bounce is due", n);
		break;
	case QUEUE_RECOVER_FINISHED:
		log_info("queue: %s finished, removed", n);
		break;
	case QUEUE_RECOVER_ORPHAN_LOG:
		log_info("queue: removed log of finished message %s", n);
		break;
	case QUEUE_RECOVER_STRAY:
		log_warning("queue: %s is not a queue file; left alone: %s", n, why);
		break;
	case QUEUE_RECOVER_ERROR:
		log_error("queue: %s: %s: %s; left in place", n, why, strerror(-ev->error));
		break;
	case QUEUE_RECOVER_LOADED:
		log_notice("queue: loaded, %zu messages in %.1f s", ev->count,
			   (double)ev->elapsed_ms / 1000.0);
		break;
	}
}

static void relay_log(void *arg, enum log_level level, const char *line)
{
	log_msg(level, "relay: %s", line);
}

static struct queue *open_queue(const struct sluice_config *c)
{
	if (mkdir(c->queue.dir, 0700) < 0 && errno != EEXIST)
		fatal("queue directory %s: %s", c->queue.dir, strerror(errno));
	struct queue_conf qc = { .dir = c->queue.dir, .commit_batch = c->queue.commit_batch };
	struct queue *q;
	char err[1024];
	if (queue_open(&qc, queue_report, NULL, &q, err, sizeof(err)) < 0)
		fatal("%s", err);
	/* its messages are loaded in the background from queue_start() on */
	log_notice("queue %s: open, loading its messages", c->queue.dir);
	return q;
}

static void store_notify(void *arg, bool bad, const char *msg)
{
	(void)arg;
	if (bad)
		log_error("%s", msg);
	else
		log_notice("%s", msg);
}

/* The Redis store (type = "redis"). */
static struct store *open_redis(const struct sluice_config *c)
{
	char err[512];
	struct store_redis_conf rc = {
		.server = c->store.server,
		.user = c->store.user,
		.password = c->store.password,
		.db = c->store.db,
		.prefix = c->store.prefix,
		.timeout_ms = (uint64_t)c->store.timeout_ms,
		.sentinels = (const char *const *)c->store.sentinels,
		.nsentinels = c->store.nsentinels,
		.master_name = c->store.master_name,
		.seeds = (const char *const *)c->store.cluster,
		.nseeds = c->store.ncluster,
		.probe = true,
		.on_failure = c->store.on_failure,
		.nodes = c->store.nodes,
		.node_id = c->store.node,
		.lease_ms = (uint64_t)c->store.lease_ms,
		.local_max_keys = c->store.max_keys,
		.notify = store_notify,
	};
	struct store *s = store_redis_new(&rc, err, sizeof(err));
	if (!s)
		fatal("%s: store: %s", c->path, err);
	return s;
}

/* The memory store, with its snapshot in state_dir when that directory exists. */
static struct store *open_store(const struct sluice_config *c)
{
	if (c->store.redis)
		return open_redis(c);
	char path[4096], warn[512];
	struct stat st;
	struct store_memory_conf mc = { .max_keys = c->store.max_keys, .snapshot = NULL };
	if (stat(c->state_dir, &st) == 0 && S_ISDIR(st.st_mode)) {
		if (fmt_fixed(path, sizeof(path), "%s/limits.snapshot", c->state_dir) < 0)
			fatal("state_dir path too long");
		mc.snapshot = path;
	} else {
		log_warning("state_dir %s is not a directory: limits will start from zero at "
			    "every restart", c->state_dir);
	}
	struct store *s = store_memory_new(&mc, realtime_ns(), warn, sizeof(warn));
	if (!s)
		fatal("out of memory at start");
	if (warn[0])
		log_error("%s", warn);
	return s;
}

/* The metrics page, on the metrics thread: the rule set is held while it renders. */
static int metrics_page(void *arg, struct buf *out)
{
	struct daemon *d = arg;
	pthread_mutex_lock(&d->cfg_lock);
	struct metrics_sources src = {
		.engine = d->e,
		.rules = policy_ref(daemon_config_of(d->cfg)->rules),
		.store = d->store,
		.queue = d->queue,
		.relay = d->relay,
		.reloads = (unsigned)d->reloads,
	};
	pthread_mutex_unlock(&d->cfg_lock);
	int r = metrics_render(&src, out);
	policy_unref(src.rules);
	return r;
}

static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	(void)fd;
	(void)what;
	unsigned n = engine_sessions(d->e);
	if (n == 0) {
		log_notice("all sessions ended; exiting");
		event_base_loopexit(d->base, NULL);
		return;
	}
	if (now_ms() >= d->drain_deadline_ms) {
		log_notice("shutdown deadline reached; closing %u sessions", n);
		event_base_loopexit(d->base, NULL);
		return;
	}
	struct timeval tv = { 0, 100 * 1000 };
	event_add(d->ev_drain, &tv);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct daemon *d = arg;
	(void)what;
	if (sig == SIGHUP) {
		log_notice("SIGHUP: reloading %s", d->config_path);
		reload_run(d);
		return;
	}
	if (d->stopping) {
		log_notice("second stop signal: closing all sessions now");
		relay_shutdown(d->relay, 0);
		event_base_loopexit(d->base, NULL);
		return;
	}
	__atomic_store_n(&d->stopping, true, __ATOMIC_RELAXED);
	notify_send("STOPPING=1\nSTATUS=stopping");
	engine_stop_listening(d->e);
	engine_drain(d->e);
	/* deliveries under way share the sessions' deadline */
	relay_shutdown(d->relay, d->cfg->shutdown_timeout_ms);
	d->drain_deadline_ms = now_ms() + (uint64_t)d->cfg->shutdown_timeout_ms;
	log_notice("%s: stopped accepting; draining %u sessions (deadline %.1fs)",
		   sig == SIGTERM ? "SIGTERM" : "SIGINT", engine_sessions(d->e),
		   (double)d->cfg->shutdown_timeout_ms / 1000.0);
	on_drain_tick(-1, 0, d);
}

/*
 * How the control socket at a is protected, for the start's log: a unix socket by its
 * peers' credentials, an inet one by the passwords (config_core.c refuses one without).
 */
static void log_control_protection(const struct sluice_config *c, const struct listen_addr *a)
{
	if (a->ss.ss_family == AF_UNIX) {
		bool root = c->control_admin == CONTROL_ADMIN_ROOT;
		log_info("control on %s: protected by peer credentials (SO_PEERCRED): root and "
			 "sluiced's user run every command, the socket's group %s", a->text,
			 root ? "only those that change nothing (admin = \"root\")"
			      : "every command (admin = \"group\")");
		return;
	}
	log_info("control on %s: protected by password: password_file's runs every command, "
		 "%s", a->text, c->control_read_password_file
				? "read_password_file's only those that change nothing"
				: "and there is no read-only one (read_password_file)");
}

/*
 * The start's line for a listener; for an inet one, the numeric address bound too (a
 * name's first address; libmilter's inet:PORT is every IPv4 address), and a warning when
 * other hosts can reach it -- a line copied from a milter's guide (inet:7357) binds every
 * address, and the milter and policy protocols have no authentication, the control
 * protocol's password crosses the network in clear.  c: for the control socket's line on
 * how it is protected (NULL for the others).
 */
static void log_listener(const char *svc, const struct listen_addr *a,
			 const struct sluice_config *c)
{
	bool control = strcmp(svc, "control") == 0;
	if (a->ss.ss_family == AF_UNIX) {
		log_info("%s listening on %s", svc, a->text);
		if (control && c)
			log_control_protection(c, a);
		return;
	}
	char shown[300];
	listen_addr_show(a, shown, sizeof(shown));
	log_info("%s listening on %s: %s", svc, a->text, shown);
	if (control && c)
		log_control_protection(c, a);
	bool intake = strcmp(svc, "intake") == 0; /* its clients are checked by allow */
	if (!listen_addr_is_local(a))
		log_warning("%s listens on %s (%s), which other hosts can reach and which has %s: "
			    "restrict it with a firewall, or listen on 127.0.0.1 or ::1", svc,
			    shown, a->text,
			    control ? "a password that crosses the network in clear"
				    : intake ? "no authentication (only intake.allow's networks "
					       "may queue mail)"
					     : "no authentication");
}

/*
 * Before the drop: make the missing parent directories of the unix sockets (0755, so that
 * each socket's own mode decides who may connect) and bind every address, each unix
 * socket given its owner, group and mode.  Nothing listens yet: until adopt_listeners()
 * connections are refused, as before the sockets existed.  0, or -1 after logging (what
 * was bound is closed).
 */
static int bind_listeners(struct daemon *d, uid_t uid, gid_t gid)
{
	const struct sluice_config *c = d->cfg;
	const struct { const char *name; const struct listen_conf *lc; } blocks[] = {
		{ "milter", &c->milter.listen },
		{ "policy", &c->policy.listen },
		{ "control", &c->control },
		{ "intake", c->intake.enabled ? &c->intake.listen : NULL },
	};
	char err[512];
	for (size_t b = 0; b < ARRAY_SIZE(blocks); b++) {
		const struct listen_conf *lc = blocks[b].lc;
		for (size_t i = 0; lc && i < lc->n; i++) {
			struct bound *bd = &d->bound[d->nbound];
			err[0] = '\0';
			int r = listen_addr_parse(lc->addr[i], &bd->addr, err, sizeof(err));
			if (r == 0 && bd->addr.ss.ss_family == AF_UNIX) {
				char dir[sizeof(bd->addr.path)];
				memcpy(dir, bd->addr.path, sizeof(dir));
				char *slash = strrchr(dir, '/');
				if (slash && slash != dir) {
					*slash = '\0';
					r = privs_mkdirs(dir, 0755, uid, gid, err, sizeof(err));
				}
			}
			/* a socket file belongs to the daemon's user and group unless told */
			uid_t owner = lc->owner != (uid_t)-1 ? lc->owner : uid;
			gid_t group = lc->group != (gid_t)-1 ? lc->group : gid;
			if (r == 0)
				r = listen_bind(&bd->addr, lc->mode, owner, group, &bd->fd, err,
						sizeof(err));
			if (r < 0) {
				log_error("%s listen %s", blocks[b].name, err);
				for (size_t k = 0; k < d->nbound; k++)
					listen_close(&d->bound[k].addr, d->bound[k].fd);
				d->nbound = 0;
				return -1;
			}
			bd->svc = blocks[b].name;
			d->nbound++;
		}
	}
	return 0;
}

/* After the drop, once the services exist: listen on each bound socket and hand it to its
 * service.  0, or -1 after logging. */
static int adopt_listeners(struct daemon *d)
{
	char err[512];
	int ret = 0;
	for (size_t i = 0; i < d->nbound; i++) {
		struct bound *bd = &d->bound[i];
		struct service *svc = strcmp(bd->svc, "milter") == 0 ? d->milter :
				      strcmp(bd->svc, "policy") == 0 ? d->policy :
				      strcmp(bd->svc, "control") == 0 ? d->control : d->intake;
		err[0] = '\0';
		/* once adopted or not, the socket is the engine's or closed */
		if (ret == 0 && (listen_start(&bd->addr, bd->fd, err, sizeof(err)) < 0 ||
				 service_adopt(svc, &bd->addr, bd->fd, err, sizeof(err)) < 0)) {
			log_error("%s listen %s", bd->svc, err);
			ret = -1;
		} else if (ret < 0) {
			listen_close(&bd->addr, bd->fd);
		} else {
			log_listener(bd->svc, &bd->addr, d->cfg);
		}
	}
	d->nbound = 0;
	return ret;
}

static int write_pid_file(const char *path)
{
	char tmp[4096], line[32];
	if (fmt_fixed(tmp, sizeof(tmp), "%s.tmp", path) < 0)
		return -ENAMETOOLONG;
	int n = snprintf(line, sizeof(line), "%ld\n", (long)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 && errno == EACCES) {
		/* a directory only root may write: the file made before the drop (pid_prepare),
		 * written in place */
		fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0)
			return -errno;
		if (write(fd, line, (size_t)n) != n || close(fd) < 0)
			return -EIO;
		return 0;
	}
	if (fd < 0)
		return -errno;
	if (write(fd, line, (size_t)n) != n || close(fd) < 0 || rename(tmp, path) < 0) {
		unlink(tmp);
		return -EIO;
	}
	return 0;
}

/* Before the drop: a pid file the user can write in place later (after detaching). */
static void pid_prepare(const char *path, uid_t uid, gid_t gid)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		log_warning("pid file %s: %s", path, strerror(errno));
		return;
	}
	if (fchown(fd, uid, gid) < 0)
		log_warning("pid file %s: chown: %s", path, strerror(errno));
	close(fd);
}

/* The owner to give a tree the user cannot use, for the error's fix: "sluice:" */
static const char *owner_fix(const struct sluice_config *c)
{
	static char who[128];
	bool drops = c->user && geteuid() == 0;
	const char *user = c->user;
	if (!drops) {
		struct passwd *pw = getpwuid(geteuid());
		user = pw ? pw->pw_name : "";
	}
	fmt_fixed(who, sizeof(who), "%s:%s", user, drops && c->group ? c->group : "");
	return who;
}

/* A start that fails before the services exist: sockets closed, the loop freed. */
static int abandon(struct daemon *d)
{
	for (size_t k = 0; k < d->nbound; k++)
		listen_close(&d->bound[k].addr, d->bound[k].fd);
	d->nbound = 0;
	event_free(d->ev_term);
	event_free(d->ev_int);
	event_free(d->ev_hup);
	thread_set_base(NULL);
	event_base_free(d->base);
	daemon_config_free(d->cfg);
	return 1;
}

static int detach(void)
{
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0)
		_exit(0);
	if (setsid() < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0)
		_exit(0);
	int fd = open("/dev/null", O_RDWR);
	if (fd >= 0) {
		dup2(fd, STDIN_FILENO);
		dup2(fd, STDOUT_FILENO);
		if (fd > STDERR_FILENO)
			close(fd);
	}
	return 0;
}

int daemon_main(int argc, char **argv)
{
	const char *path = CONFIG_DEFAULT_PATH, *pid_file = NULL;
	bool check = false, background = false;
	int opt, print = 0; /* 'n' or 'D' */
	opterr = 0;   /* getopt's own message would carry no journal priority */
	while ((opt = getopt(argc, argv, ":c:tnDdp:Vh")) != -1) {
		switch (opt) {
		case 'c': path = optarg; break;
		case 't': check = true; break;
		case 'n': case 'D': print = opt; break;
		case 'd': background = true; break;
		case 'p': pid_file = optarg; break;
		case 'V': printf("sluiced %s\n", SLUICE_VERSION); return 0;
		case 'h': usage(stdout); return 0;
		default:
			fprintf(stderr, "%ssluiced: %s -- '%c'\n", log_stderr_prefix(LOG_LEVEL_ERROR),
				opt == ':' ? "option requires an argument" : "invalid option", optopt);
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "%ssluiced: unexpected argument '%s'\n",
			log_stderr_prefix(LOG_LEVEL_ERROR), argv[optind]);
		usage(stderr);
		return 2;
	}
	char err[1024];
	if (daemon_control_check(err, sizeof(err)) < 0) {
		/* a build whose two tables disagree */
		fprintf(stderr, "%ssluiced: %s\n", log_stderr_prefix(LOG_LEVEL_ERROR), err);
		return 70;
	}
	struct daemon d = { .config_path = path, .started_ms = now_ms() };
	pthread_mutex_init(&d.cfg_lock, NULL);
	pthread_mutex_init(&d.reload_lock, NULL);
	config_resolve_listen_hosts(true); /* this load's listeners are bound (or checked) */
	int cr = daemon_config_load(path, &d.cfg, err, sizeof(err));
	config_resolve_listen_hosts(false); /* reloads bind nothing */
	if (cr < 0) {
		fprintf(stderr, "%ssluiced: %s\n", log_stderr_prefix(LOG_LEVEL_ERROR), err);
		return 1;
	}
	if (print) {
		daemon_config_print(stdout, d.cfg, print == 'D');
		daemon_config_free(d.cfg);
		return 0;
	}
	if (check) {
		if (geteuid() == 0 && !d.cfg->user)
			fprintf(stderr, "%ssluiced: warning: %s has no user: started as root, sluiced "
				"would refuse it (add user = \"sluice\"; or user = \"root\";)\n",
				log_stderr_prefix(LOG_LEVEL_WARNING), path);
		printf("sluiced: %s: configuration ok\n", path);
		daemon_config_free(d.cfg);
		return 0;
	}
	bool root = geteuid() == 0;
	if (root && !d.cfg->user) {
		fprintf(stderr, "%ssluiced: %s: started as root with no user: add user = \"sluice\"; "
			"to run as that user once the sockets are bound (or user = \"root\"; to "
			"keep running as root)\n", log_stderr_prefix(LOG_LEVEL_ERROR), path);
		daemon_config_free(d.cfg);
		return 1;
	}
	if (background && d.cfg->log.target == LOG_TARGET_STDERR)
		fprintf(stderr, "%ssluiced: warning: -d with log target stderr: logs go to /dev/null "
				"unless stderr is redirected\n", log_stderr_prefix(LOG_LEVEL_WARNING));
	log_setup(d.cfg->log.target, d.cfg->log.facility, d.cfg->log.level);
	signal(SIGPIPE, SIG_IGN);
	if (daemon_fds_raise(&d) < 0) {
		daemon_config_free(d.cfg);
		return 1;
	}
	d.base = event_base_new();
	if (!d.base)
		fatal("cannot create the event loop");
	thread_set_base(d.base); /* the Redis store's lease renewals run on this loop */
	/* Signals first: a SIGTERM that arrives while the listeners open is handled (once the
	 * loop runs) like any other, with the snapshot saved and the sockets removed. */
	d.ev_term = evsignal_new(d.base, SIGTERM, on_signal, &d);
	d.ev_int = evsignal_new(d.base, SIGINT, on_signal, &d);
	d.ev_hup = evsignal_new(d.base, SIGHUP, on_signal, &d);
	if (!d.ev_term || !d.ev_int || !d.ev_hup || event_add(d.ev_term, NULL) < 0 ||
	    event_add(d.ev_int, NULL) < 0 || event_add(d.ev_hup, NULL) < 0)
		fatal("cannot install signal handlers");
	/* What must be done as root is done here, before the drop: the directories, the
	 * sockets (privileged ports, owners), the pid file; the configuration and its
	 * secrets were read above.  Everything after runs as the user. */
	bool drop = root && d.cfg->uid != 0;
	uid_t uid = drop ? d.cfg->uid : (uid_t)-1;
	gid_t gid = drop ? d.cfg->gid : (gid_t)-1;
	if (root && !drop)
		log_notice("user = \"root\": sluiced keeps running as root");
	else if (!root && d.cfg->user && (d.cfg->uid != geteuid() || d.cfg->gid != getegid()))
		log_notice("not started as root: user and group are not applied; running as uid "
			   "%lu, gid %lu", (unsigned long)geteuid(), (unsigned long)getegid());
	bool need_queue = d.cfg->intake.enabled || daemon_config_of(d.cfg)->relay.nroutes;
	/* the store's snapshot and the relay's send history live in state_dir */
	if (d.cfg->state_dir && privs_mkdirs(d.cfg->state_dir, 0750, uid, gid, err, sizeof(err)) < 0)
		log_warning("state_dir: %s", err);
	if (need_queue && privs_mkdirs(d.cfg->queue.dir, 0750, uid, gid, err, sizeof(err)) < 0) {
		log_error("queue directory: %s", err);
		return abandon(&d);
	}
	/* systemd's ExecStartPre or a package may have made them, empty, for root */
	if (d.cfg->state_dir)
		privs_adopt_empty(d.cfg->state_dir, 0750, uid, gid);
	if (need_queue)
		privs_adopt_empty(d.cfg->queue.dir, 0750, uid, gid);
	const char *dirs[] = { d.cfg->state_dir, need_queue ? d.cfg->queue.dir : NULL };
	for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
		if (!dirs[i] || privs_check_tree(dirs[i], uid, gid, err, sizeof(err)) == 0)
			continue;
		log_error("%s; fix: chown -R %s %s", err, owner_fix(d.cfg), dirs[i]);
		return abandon(&d);
	}
	if (bind_listeners(&d, uid, gid) < 0)
		return abandon(&d);
	if (drop && background && (pid_file || d.cfg->pid_file))
		pid_prepare(pid_file ? pid_file : d.cfg->pid_file, uid, gid);
	if (drop) {
		if (privs_drop(uid, gid, err, sizeof(err)) < 0) {
			log_error("cannot drop privileges to user %s: %s", d.cfg->user, err);
			return abandon(&d);
		}
		log_notice("running as user %s (uid %lu, gid %lu)", d.cfg->user, (unsigned long)uid,
			   (unsigned long)gid);
	}

	d.store = open_store(d.cfg);
	policy_set_store(daemon_config_of(d.cfg)->rules, d.store);
	d.e = engine_new(d.cfg->workers, d.base);
	if (!d.e)
		fatal("out of memory at start");
	if (d.cfg->milter.listen.n) {
		struct milter_handler *h = daemon_services_milter_handler(d.cfg);
		struct milter_service_conf mc = daemon_services_milter_conf(d.cfg);
		if (!h || !(d.milter = milter_service_new(d.e, h, &mc)))
			fatal("out of memory at start");
	}
	if (d.cfg->policy.listen.n) {
		struct pfpolicy_conf pc = daemon_services_pfpolicy_conf(d.cfg);
		if (!(d.policy = pfpolicy_service_new(d.e, daemon_config_of(d.cfg)->rules, &pc)))
			fatal("out of memory at start");
	}
	if (d.cfg->intake.enabled || daemon_config_of(d.cfg)->relay.nroutes)
		d.queue = open_queue(d.cfg);
	if (daemon_config_of(d.cfg)->relay.nroutes) {
		char rerr[512];
		d.relay = relay_new(&daemon_config_of(d.cfg)->relay, d.queue, d.store,
				    daemon_config_of(d.cfg)->rules, relay_log, NULL, rerr, sizeof(rerr));
		if (!d.relay)
			fatal("relay: %s", rerr);
	} else if (d.queue) {
		log_notice("no route configured: queued mail stays in the queue");
	}
	if (d.cfg->intake.enabled) {
		struct intake_conf ic = daemon_services_intake_conf(d.cfg);
		if (!(d.intake = intake_service_new(d.e, d.queue, &ic)))
			fatal("out of memory at start");
	}
	d.control_owner = daemon_control_owner(&d);
	if (d.cfg->control.n && !(d.control = control_service_new(d.e, &d.control_owner)))
		fatal("out of memory at start");
	const struct policy *rules = daemon_config_of(d.cfg)->rules;
	if (d.cfg->store.redis)
		log_info("rules: %zu limits, %s; store: redis %s, timeout %lldms, on_failure %s, "
			 "nodes %u", policy_rule_count(rules),
			 policy_has_classes(rules) ? "host classes" : "no host classes",
			 d.cfg->store.server ? d.cfg->store.server :
			 d.cfg->store.master_name ? d.cfg->store.master_name :
			 d.cfg->store.ncluster ? "cluster" : "127.0.0.1:6379",
			 (long long)d.cfg->store.timeout_ms,
			 d.cfg->store.on_failure == STORE_FAIL_LOCAL ? "local" :
			 d.cfg->store.on_failure == STORE_FAIL_ACCEPT ? "accept" : "tempfail",
			 d.cfg->store.nodes);
	else
		log_info("rules: %zu limits, %s; store: memory, max_keys %llu",
			 policy_rule_count(rules),
			 policy_has_classes(rules) ? "host classes" : "no host classes",
			 (unsigned long long)d.cfg->store.max_keys);
	daemon_services_limits(&d, d.cfg);
	daemon_fds_check(&d, d.cfg, false); /* the engine exists now: it learns what is held */
	int lr = adopt_listeners(&d);
	if (lr == 0 && d.cfg->metrics.enabled) {
		err[0] = '\0';
		lr = metrics_new(d.cfg->metrics.listen, d.cfg->metrics.max_connections, metrics_page,
				 &d, &d.metrics, err, sizeof(err));
		if (lr < 0)
			log_error("metrics listen %s", err);
		else
			log_listener("metrics", metrics_address(d.metrics), NULL);
	}
	if (lr < 0) {
		engine_free(d.e);
		relay_free(d.relay);
		queue_free(d.queue);
		daemon_config_free(d.cfg);
		store_free(d.store);
		event_free(d.ev_term);
		event_free(d.ev_int);
		event_free(d.ev_hup);
		event_base_free(d.base);
		return 1;
	}
	if (background) {
		if (detach() < 0)
			fatal("cannot detach: %s", strerror(errno));
		/* libevent's epoll fd survives fork() in the child that continues; the parent
		 * exits without touching it. */
		event_reinit(d.base);
		d.pid_file = strdup(pid_file ? pid_file : d.cfg->pid_file ? d.cfg->pid_file : "");
		if (d.pid_file && d.pid_file[0] && write_pid_file(d.pid_file) < 0)
			fatal("cannot write pid file %s", d.pid_file);
	}
	if (engine_start(d.e) < 0)
		fatal("cannot start worker threads");
	if (d.queue && queue_start(d.queue) < 0)
		fatal("cannot start the queue's committer thread");
	if (d.relay && relay_start(d.relay) < 0)
		fatal("cannot start the relay's thread");
	if (d.metrics && metrics_start(d.metrics) < 0)
		fatal("cannot start the metrics thread");
	d.ev_drain = evtimer_new(d.base, on_drain_tick, &d);
	if (!d.ev_drain)
		fatal("cannot create timers");
	daemon_timers_start(&d);
	daemon_fds_recount(&d);
	log_notice("sluiced %s started: %u workers, configuration %s, file descriptor limit %llu "
		   "(%llu held back from the sessions)", SLUICE_VERSION, engine_workers(d.e), path,
		   (unsigned long long)d.nofile, (unsigned long long)d.fds_held);
	/* every listener accepts and the privileges are dropped: systemd may go on */
	notify_send("READY=1\nSTATUS=running");
	event_base_dispatch(d.base);

	daemon_timers_stats(&d, false);
	/* first: a page being rendered asks the relay's loop */
	d.metrics = metrics_free(d.metrics);
	engine_stop_listening(d.e);
	/* transactions under way get until the drain deadline; what is cut stays T */
	relay_stop(d.relay,
		   d.drain_deadline_ms > now_ms() ? (int64_t)(d.drain_deadline_ms - now_ms()) : 0);
	if (d.queue)
		queue_drain(d.queue); /* every commit answered while the workers still run */
	engine_stop(d.e);
	reload_forget(&d);
	/* the store's connections live on the loops: freed while the loops still exist */
	daemon_timers_snapshot(&d);
	d.store = store_free(d.store);
	lease_clear(&d.lease);
	d.relay = relay_free(d.relay);
	d.queue = queue_free(d.queue);
	engine_free(d.e);
	event_free(d.ev_term);
	event_free(d.ev_int);
	event_free(d.ev_hup);
	event_free(d.ev_drain);
	daemon_timers_free(&d);
	thread_set_base(NULL);
	event_base_free(d.base);
	/* XXX after the drop, a pid file (or a unix socket, in listen_close) in a directory
	 * only root may write cannot be removed: it stays until the next start, which
	 * rewrites the pid file in place and removes the stale socket. */
	if (d.pid_file && d.pid_file[0])
		unlink(d.pid_file);
	free(d.pid_file);
	daemon_config_free(d.cfg);
	pthread_mutex_destroy(&d.cfg_lock);
	pthread_mutex_destroy(&d.reload_lock);
	log_notice("sluiced stopped");
	return 0;
}
