/*
 * config_schema -- the tables of sluice.conf's blocks, for the loading (config_core.c),
 * sluiced -n and -D, and the tests.  Each block's keys are data: see cfg_schema.h for the
 * walker.  The relay's, a route's and a provider's keys are the relay's (relay.h); the
 * limits' and classes' the rules'; the milter's fixed answers the milter's.
 */
#ifndef SLUICE_CONFIG_SCHEMA_H
#define SLUICE_CONFIG_SCHEMA_H

#include <stdbool.h>
#include <stdio.h>

#include "cfg_schema.h"
#include "config.h"

/* What a reload cannot change (a key's restart column): each group is one warning. */
enum config_restart {
	CONFIG_RESTART_NONE = 0,   /* applies at reload */
	CONFIG_RESTART_USER,       /* the process's user and group */
	CONFIG_RESTART_LISTEN,     /* the sockets bound at start */
	CONFIG_RESTART_WORKERS,
	CONFIG_RESTART_STATE_DIR,
	CONFIG_RESTART_STORE,      /* the store is made once, at start */
	CONFIG_RESTART_QUEUE,
	CONFIG_RESTART_COUNT,
};

struct config_block {
	const char *name;            /* "" for the root's keys */
	const struct cfg_key *keys;  /* offsets into struct sluice_config */
	/* Whether c has the block (a milter {} was given...); NULL: always. */
	bool (*present)(const struct sluice_config *c);
	enum config_restart restart; /* what a block given or taken away needs */
};

/* Every block handled by the tables, in the order sluice.conf(5) lists them; { NULL }
 * ends it.  The store's Redis keys are the block "store" a second time. */
extern const struct config_block config_blocks[];

extern const struct cfg_key config_root_keys[], config_log_keys[], config_control_keys[],
	config_metrics_keys[], config_milter_keys[], config_policy_keys[], config_intake_keys[],
	config_queue_keys[], config_store_keys[], config_redis_keys[];

/*
 * Write c in sluice.conf syntax: every block it has with every key (all = true), or only
 * the values that differ from the defaults (all = false, as postconf -n).  The blocks of
 * the daemon (relay, route, limit...) are daemon_config_print()'s, which calls this and
 * config_print_block(); inside (may be NULL) writes what the daemon adds inside one of
 * these blocks (the milter's reply {} and modify {}), at depth 1, before its "}", and
 * returns the lines it wrote.
 */
typedef size_t config_print_inside_fn(FILE *f, const char *block, bool all, const void *arg);
void config_print(FILE *f, const struct sluice_config *c, bool all,
		  config_print_inside_fn *inside, const void *arg);

/*
 * Write one block "name { ... }" (label non-NULL: name "label" { ... }) from keys over
 * base; with defaults non-NULL only what differs from it.  always: written even with
 * no line in it (the block was given).  Returns the number of key lines written.
 */
size_t config_print_block(FILE *f, const char *name, const char *label,
			  const struct cfg_key *keys, const void *base, const void *defaults,
			  bool always);

/*
 * What of nc needs a restart to apply, against the running old: the union of
 * 1u << enum config_restart over the keys and blocks that changed (the restart column of
 * the tables).  config_restart_text() is each group's warning.
 */
unsigned config_restart_changes(const struct sluice_config *old, const struct sluice_config *nc);
const char *config_restart_text(enum config_restart g);

/* Set the defaults of the tables and the rest of c's initial state.  0 or -ENOMEM. */
int config_init(struct sluice_config *c);

#endif
