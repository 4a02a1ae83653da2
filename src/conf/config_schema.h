/*
 * config_schema -- the tables of sluice.conf's blocks, for the loading (config_core.c),
 * sluiced -n and -D, and the tests.  Each block's keys are data: see cfg_schema.h for the
 * walker.  A route's keys are the relay's (route_conf_keys in relay.h).
 */
#ifndef SLUICE_CONFIG_SCHEMA_H
#define SLUICE_CONFIG_SCHEMA_H

#include <stdbool.h>
#include <stdio.h>

#include "cfg_schema.h"
#include "config.h"

struct config_block {
	const char *name;            /* "" for the root's keys */
	const struct cfg_key *keys;  /* offsets into struct sluice_config */
	/* Whether c has the block (a milter {} was given...); NULL: always. */
	bool (*present)(const struct sluice_config *c);
};

/* Every block handled by the tables, in the order sluice.conf(5) lists them; { NULL }
 * ends it.  The store's Redis keys are the block "store" a second time. */
extern const struct config_block config_blocks[];

extern const struct cfg_key config_root_keys[], config_log_keys[], config_control_keys[],
	config_metrics_keys[], config_milter_keys[], config_policy_keys[], config_intake_keys[],
	config_queue_keys[], config_store_keys[], config_redis_keys[], config_relay_keys[];

/*
 * Write c in sluice.conf syntax: every block it has with every key (all = true), or only
 * the values that differ from the defaults (all = false, as postconf -n).  Blocks that
 * stay code (milter reply/modify, limit, class, route) are not written.
 */
void config_print(FILE *f, const struct sluice_config *c, bool all);

/* Set the defaults of the tables and the rest of c's initial state.  0 or -ENOMEM. */
int config_init(struct sluice_config *c);

#endif
