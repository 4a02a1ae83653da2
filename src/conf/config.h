/*
 * config -- sluiced's configuration: the schema over the cfg tree.
 *
 * The struct and config_load_client() live in the conf layer (src/conf), which the sluice
 * command links alone: nothing here is of the policy engine, the milter or the relay.
 * What sluiced reads beyond it (the rules, the milter's fixed answers, the relay and its
 * routes) is struct daemon_config's (src/daemon/daemon_config.h), which holds this one.
 *
 * Loading is all or nothing: a file with any error yields no configuration, and the error
 * names file, line and key.  A loaded configuration is immutable; reload builds a new one.
 */
#ifndef SLUICE_CONFIG_H
#define SLUICE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "build_config.h"
#include "ipaddr.h"
#include "log.h"
#include "store.h"

#define CONFIG_DEFAULT_PATH SLUICE_SYSCONFDIR "/sluice.conf"
#define CONFIG_MAX_LISTEN 16

struct listen_conf {
	char *addr[CONFIG_MAX_LISTEN];
	size_t n;
	unsigned mode; /* unix sockets; 0 = leave umask result */
	uid_t owner;   /* unix sockets: chown after bind; (uid_t)-1 = unchanged */
	gid_t group;   /* (gid_t)-1 = unchanged */
};

/* intake.bare_newline: what DATA with a bare LF or CR line end becomes (doc/INTAKE.md) */
enum intake_bare_newline {
	INTAKE_BARE_NORMALIZE = 0, /* stored with CRLF, as Postfix's "normalize" */
	INTAKE_BARE_REJECT,        /* the message refused at its end with 550 5.5.2 */
};

enum control_admin {
	CONTROL_ADMIN_GROUP = 0, /* every peer let in may change state */
	CONTROL_ADMIN_ROOT,      /* only root and the daemon's user may */
};

struct sluice_config {
	char *path;
	unsigned workers;            /* 0 = number of CPUs */
	int64_t stats_interval_ms;   /* 0 = off */
	int64_t shutdown_timeout_ms; /* drain deadline on SIGTERM */
	char *pid_file;              /* with -d */
	char *user;                  /* user = ...; NULL: not given */
	uid_t uid;                   /* of user, when given */
	gid_t gid;                   /* of group, or user's primary group */
	char *group;                 /* group = ...; NULL: user's primary group */
	enum control_admin control_admin;
	bool control_allow_remote;   /* control.listen may be reached from other hosts */
	/* The credentials of an inet control socket (control_service.c): password_file
	 * runs every command, read_password_file only those that change nothing.  The
	 * passwords are their files' first lines, read by sluiced only (not the sluice
	 * command's config_load_client()). */
	char *control_password_file;
	char *control_read_password_file;
	char *control_password;
	char *control_read_password;
	struct {
		enum log_target target;
		int facility;
		enum log_level level;
	} log;
	struct listen_conf control;
	struct {
		bool enabled;                 /* a metrics {} block was given */
		char *listen;                 /* one address; loopback unless allow_remote */
		bool allow_remote;
		unsigned max_connections;     /* scrapers served at once; more wait unaccepted */
	} metrics;
	struct {
		struct listen_conf listen;
		unsigned max_sessions;
		int64_t idle_timeout_ms;
		int64_t command_timeout_ms;
		uint64_t max_packet;
	} milter;
	struct {
		struct listen_conf listen;
		unsigned max_sessions;
		int64_t idle_timeout_ms;
		int64_t command_timeout_ms;
		uint64_t max_request;
	} policy;
	struct {
		bool enabled;                 /* an intake {} block was given */
		struct listen_conf listen;
		struct ip_prefix *allow;      /* clients that may queue mail (unix: always) */
		size_t nallow;
		unsigned max_sessions;
		int64_t idle_timeout_ms;      /* waiting for the next command (RFC 5321 4.5.3.2.7) */
		int64_t command_timeout_ms;   /* a command line or a DATA block under way */
		int64_t data_timeout_ms;      /* a message's data, from 354 to the final dot */
		uint64_t data_min_rate;       /* bytes a second that earn data time; 0: none */
		uint64_t max_message_size;    /* 552 5.3.4 past it; advertised in EHLO SIZE */
		unsigned max_recipients;      /* 452 4.5.3 past it */
		unsigned max_errors;          /* bad commands before the session is closed */
		uint64_t max_line_length;     /* octets of a message line, CRLF excluded */
		enum intake_bare_newline bare_newline; /* DATA's bare LF or CR: CRLF or 550 */
		char *hostname;               /* greeting, Received:; default: gethostname() */
	} intake;
	struct {
		char *dir;
		unsigned commit_batch;        /* messages flushed together at most */
		int64_t lifetime_ms;          /* a message's time in the queue before it bounces */
		uint64_t min_free;            /* bytes kept free: MAIL refused with 452 4.3.1 */
	} queue;
	char *state_dir;
	struct {
		int type;                     /* 0: memory, 1: redis */
		bool redis;                   /* type = "redis" */
		uint64_t max_keys;
		int64_t snapshot_interval_ms; /* 0 = only at shutdown */
		int64_t overrides_check_ms;   /* how often overrides files are checked */
		/* redis */
		char *server;
		char *user;
		char *password;               /* from password or password_file */
		char *password_file;
		unsigned db;
		char *prefix;
		int64_t timeout_ms;
		char **sentinels;             /* NULL-terminated, or NULL */
		size_t nsentinels;
		char **cluster;               /* seed nodes, NULL-terminated, or NULL */
		size_t ncluster;
		char *master_name;
		enum store_failure on_failure;
		unsigned nodes;
		char *node;
		int64_t lease_ms;
	} store;
	bool client;                          /* config_load_client() */
};

/*
 * The part the sluice command needs (the control and intake blocks, and what comes
 * before the rules): no secret file is read and the limit, class and route blocks are
 * not loaded, so an operator or a program injecting mail needs only to read sluice.conf
 * itself, not the daemon's secrets or overrides files.  0 and *ret, or <0 with err
 * "FILE:LINE: KEY: message".  (sluiced's whole load is daemon_config_load().)
 */
int config_load_client(const char *path, struct sluice_config **ret, char *err, size_t errlen);
struct sluice_config *config_free(struct sluice_config *c);
/* Free what c's members own and zero it (c itself not freed: it may be embedded). */
void config_clear(struct sluice_config *c);
/*
 * The first line of a password file (at most 4096 bytes), without checking who may read
 * it: sluiced's secrets go through config_read_secret(), which does; the sluice command
 * reads its control password with this.  0 with *ret (owned; wipe it), -ENODATA for an
 * empty first line, or another -errno (-EFBIG: too large).
 */
int config_secret_line(const char *file, char **ret);
/*
 * Whether loading looks up the host names of listen addresses (sluiced -t and the
 * start: an unknown name is an error with its line).  Off for reloads, which bind
 * nothing: a lookup there would block the loop that reloads (a control session's worker)
 * and turn a resolver's hiccup into a refused reload.  Off by default.
 */
void config_resolve_listen_hosts(bool on);
bool config_resolving_listen_hosts(void);

#endif
