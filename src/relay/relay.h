/*
 * relay -- delivery from the queue: routes, lanes and their exact budgets, the scheduler,
 * reply classification into recipient states and lane signals, bounces.
 *
 * The relay runs on one thread of its own with its own event loop (started after the
 * daemon forks), which owns every lane, every outgoing connection and the relay's view of
 * the queue: the only owner of all lane budgets, so "may I send" needs no lock and two
 * deliveries never race for one slot (law 4, doc/ARCHITECTURE.md).  Its thread count
 * does not depend on the number of connections: one loop, non-blocking sockets (law 1).
 *
 * Other threads talk to it through a mailbox: the queue's events (a commit, hold,
 * release, delete, flush), configuration reloads, and `sluice lanes` (a control worker
 * waits for the answer, which the relay gives without waiting on any peer).
 *
 * A lane is what one budget governs: the route, for a smarthost; the destination domain,
 * for direct (MX) delivery.  A lane sends at most N messages (or recipients) in any
 * window of each configured length (slide.h; for a shared lane the Redis script
 * slide.lua), counted when the transaction starts -- just before MAIL FROM is written on
 * a connection whose session is ready -- so that the relay, which counts when it reads
 * MAIL FROM, never sees more.  A guard (default 100 ms) is added to every window to
 * absorb the network's jitter between the two clocks.
 *
 * Invariants: a recipient's state on disk changes only here, by one byte; throttling,
 * quota and ban replies suspend the lane and change no recipient (law 5); a message is
 * never in two transactions for the same recipient at once.
 */
#ifndef SLUICE_RELAY_H
#define SLUICE_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "buf.h"
#include "cfg_schema.h"
#include "classify.h"
#include "log.h"
#include "rate.h"
#include "smtp_out.h"

struct policy;
struct queue;
struct store;
struct relay;

enum route_count {
	ROUTE_COUNT_MESSAGES = 0,
	ROUTE_COUNT_RECIPIENTS,
};

/* What a lane of an mx route is (`lanes`): the destination domain (ROUTE:DOMAIN), the set
 * of its MX hosts (ROUTE:mx:HOSTS, every domain with the same MX hosts shares it), or
 * the provider whose patterns match its MX hosts (ROUTE:provider:NAME; the other
 * domains keep a lane each). */
enum route_lanes {
	ROUTE_LANES_DOMAIN = 0,
	ROUTE_LANES_MX,
	ROUTE_LANES_PROVIDER,
};

enum relay_uncertain {
	RELAY_UNCERTAIN_RETRY = 0, /* U, then sent again at the next retry (a possible duplicate) */
	RELAY_UNCERTAIN_HOLD,      /* U, and the message is held for the operator */
};

/* `route "name" { ... }` */
struct route_conf {
	char *name;
	char **domains;              /* "example.com", "*.example.com", "*" */
	size_t ndomains;
	bool mx;                     /* direct delivery; else smarthost */
	char *host;                  /* smarthost name or address */
	uint16_t port;               /* smarthost port (25) */
	unsigned mx_port;            /* mx: the MX hosts' port (25; `port`) */
	char *helo;                  /* NULL: the relay's hostname */
	enum smtp_out_tls tls;
	char *ca_file;
	char *sni;                   /* NULL: host (smarthost) or the MX name */
	char *auth_user;             /* NULL: no AUTH */
	char *auth_password_file;    /* where auth_password was read from */
	char *auth_password;         /* the daemon reads it (auth_password_file's first line) */
	char *auth_mechanisms;
	bool auth_plaintext;
	struct sockaddr_storage source; /* ss_family 0: none */
	socklen_t sourcelen;
	struct rate_limits rate;     /* n = 0: unlimited */
	enum route_count count;
	unsigned connections;        /* simultaneous, per lane */
	unsigned messages_per_connection;
	unsigned recipients_per_message;
	int64_t guard_ms;            /* added to every window */
	bool shared;                 /* the budget is in the Redis store, shared by nodes */
	enum route_lanes lanes;      /* mx routes: what one lane holds */
	struct classify_signal_conf *signals;
	size_t nsignals;
	uint64_t timeout_ms[SMTP_STAGE_COUNT];
};

/* The keys of route "name" { } (cfg_schema.h; relay_conf.c), of its auth { } (the
 * password itself is the daemon's to read, from auth_password_file) and of its
 * repeatable signal { } (struct classify_signal_conf). */
extern const struct cfg_key route_conf_keys[], route_auth_keys[], route_signal_keys[];
/* A route's defaults before its block is read (connections depends on mx). */
int route_conf_defaults(struct route_conf *rc, bool mx);

/* `provider "name" { mx = [...]; rate = [...]; connections = N; }`: the domains whose MX
 * hosts match one of mx ("host", "*.suffix") share one lane and this budget in the mx
 * routes with lanes = "provider". */
struct provider_conf {
	char *name;
	char **mx;                   /* NULL-terminated patterns */
	struct rate_limits rate;     /* n = 0: unlimited */
	unsigned connections;
};

/* The keys of provider "name" { } (relay_conf.c). */
extern const struct cfg_key provider_conf_keys[];

/* `relay { ... }` and the routes. */
struct relay_conf {
	struct route_conf *routes;
	size_t nroutes;
	struct provider_conf *providers;
	size_t nproviders;
	char *hostname;              /* EHLO default, Reporting-MTA */
	int64_t retry_min_ms;        /* a recipient's first retry after a 4xx */
	int64_t retry_max_ms;
	int64_t suspend_min_ms;      /* a lane's first suspension without a hint */
	int64_t suspend_max_ms;
	enum relay_uncertain uncertain;
	int64_t lifetime_ms;         /* queue.lifetime */
	int64_t delay_warning_ms;    /* 0: no delay notices */
	char *postmaster;            /* DSNs that cannot go back (null sender) go here; NULL: none */
	char *dns_servers;           /* "ip[:port],..."; NULL: /etc/resolv.conf */
	int64_t idle_ms;             /* an idle connection is closed after this */
	int64_t dns_min_ttl_ms;      /* an MX, address or TLSA answer is used for its TTL, */
	int64_t dns_max_ttl_ms;      /* at least min and at most max */
	int64_t dns_retry_min_ms;    /* a failed lookup is tried again after min, doubling */
	int64_t dns_retry_max_ms;    /* up to max */
	char *state_dir;             /* lanes' send history (relay.lanes) */
};

/* The keys of relay { } (cfg_schema.h; relay_conf.c), offsets into struct relay_conf. */
extern const struct cfg_key relay_conf_keys[];

void relay_conf_init(struct relay_conf *c);  /* the defaults */
/* Reads a route's auth password from file (named at node n) into *ret: the daemon's,
 * which checks who may read the file.  0 or -errno with err set. */
typedef int relay_conf_secret_fn(void *arg, struct cfg_node *n, const char *file, char **ret,
				 char *err, size_t errlen);
/*
 * Read relay { }, the route blocks and the provider blocks of root into c (zeroed), with
 * every check across their keys.  shared_store: a Redis store holds shared lanes' budgets.
 * read_secret (may be NULL: no password read) fills each auth_password.  0, or
 * -EINVAL/-ENOMEM with err "FILE:LINE: KEY: message"; relay_conf_clear() frees c either way.
 */
int relay_conf_load(struct cfg_node *root, struct relay_conf *c, bool shared_store,
		    relay_conf_secret_fn *read_secret, void *arg, char *err, size_t errlen);
void relay_conf_clear(struct relay_conf *c);
void route_conf_clear(struct route_conf *r);
/* A deep copy (for the relay thread: the daemon's configuration may go away). */
int relay_conf_copy(const struct relay_conf *src, struct relay_conf *ret);
/* The route for a recipient domain (first match), or NULL. */
const struct route_conf *relay_conf_route(const struct relay_conf *c, const char *domain);

/* The first provider (in file order) with a pattern that matches the MX host name host
 * ("*.example.net" the names below example.net, else the exact name; ASCII
 * case-insensitive, a final dot ignored), or NULL. */
const struct provider_conf *relay_conf_provider(const struct relay_conf *c, const char *host);
void provider_conf_clear(struct provider_conf *p);

/* Log of deliveries and lane events, for the daemon: called on the relay thread. */
typedef void relay_log_fn(void *arg, enum log_level level, const char *line);

/*
 * Make the relay over q (opened; its listener is set here).  store: for shared lanes
 * (may be NULL).  rules: the host classes an outgoing connection takes a slot in (may be
 * NULL; the relay holds a reference).  Nothing runs until relay_start().  NULL with err.
 */
struct relay *relay_new(const struct relay_conf *conf, struct queue *q, struct store *store,
			struct policy *rules, relay_log_fn *log, void *log_arg, char *err,
			size_t errlen);
/* Start the relay's thread (after the fork).  0 or -errno. */
int relay_start(struct relay *r);
/* A new configuration: copied; applies to the next send, budgets keep their history.
 * rules: the new host classes (a reference is taken). */
int relay_reconfigure(struct relay *r, const struct relay_conf *conf, struct policy *rules);
/* Begin stopping, without waiting: no new transactions; those under way get deadline_ms
 * to finish, then connections are closed (their recipients stay T: sent again after a
 * restart).  Called again, a shorter deadline wins. */
void relay_shutdown(struct relay *r, int64_t deadline_ms);
/* relay_shutdown(), then wait for the relay's thread to end. */
void relay_stop(struct relay *r, int64_t deadline_ms);
struct relay *relay_free(struct relay *r);

/* `sluice lanes [--json]`: appended to out. */
int relay_lanes(struct relay *r, bool json, struct buf *out);
/* "lanes N", then a line per lane, at most max, suspended and busy ones first:
 * "lane NAME USED/LIMIT/WINDOW... next ... conns ... waiting ... sent/def/fail ...". */
int relay_lanes_brief(struct relay *r, size_t max, struct buf *out);
/* `sluice lanes suspend NAME [FOR]` / `resume NAME`.  0, -ENOENT. */
int relay_lane_suspend(struct relay *r, const char *name, int64_t for_ms);
int relay_lane_resume(struct relay *r, const char *name);

struct relay_stats {
	uint64_t transactions;       /* started (each counted in its lane's budget) */
	uint64_t delivered;          /* recipients D */
	uint64_t failed;             /* recipients F */
	uint64_t deferred;           /* recipient retries scheduled */
	uint64_t uncertain;          /* recipients U (connection lost after the dot) */
	uint64_t suspensions;
	uint64_t dsn_sent;           /* DSNs queued: bounces and delay notices */
	uint64_t dsn_delay_sent;     /* of those, delay notices */
	uint64_t dsn_skipped;        /* bounces of null-sender messages, logged only */
	uint64_t connections;        /* opened */
	unsigned lanes;
	unsigned active_connections;
};
void relay_stats(struct relay *r, struct relay_stats *ret);

/* A lane's counters and budget, for the metrics. */
struct relay_lane_metrics {
	char name[256];              /* cut if longer */
	char route[64];
	uint64_t sends, delivered, deferred, failed, suspensions;
	unsigned nwin;
	double window_s[RATE_MAX_WINDOWS];
	uint64_t used[RATE_MAX_WINDOWS];       /* sends counted in the window now */
	uint64_t limit[RATE_MAX_WINDOWS];      /* what the window allows now (slowed: less) */
	uint64_t configured[RATE_MAX_WINDOWS];
	double rate_factor;          /* adaptive shaping: 1 = the configured rate */
	bool suspended;
	char reason[128];            /* when suspended: printable ASCII, no quote */
	unsigned connections, max_connections;
};
/*
 * The first max lanes into ret, *ret_n the number of lanes (may be more than max), and
 * the relay's totals, answered by the relay's loop: the caller waits for it (the relay
 * never waits on a peer, so briefly), so it must not be a worker.  0 or -errno.
 */
int relay_lane_metrics(struct relay *r, struct relay_lane_metrics *ret, size_t max,
		       size_t *ret_n, struct relay_stats *ret_stats);

#endif
