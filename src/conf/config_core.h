/*
 * config_core -- the part of loading sluice.conf below the daemon (see config_core.c),
 * and the helpers src/daemon/daemon_config.c shares with it.  Private to the
 * configuration.
 */
#ifndef SLUICE_CONFIG_CORE_H
#define SLUICE_CONFIG_CORE_H

#include <stdbool.h>
#include <stddef.h>

#include "cfg.h"
#include "config.h"

/*
 * Parse path and read every block of the tables into c (zeroed storage, the caller's:
 * sluiced embeds it in its struct daemon_config).  0 with *ret_root (the tree, for the
 * caller to read the rest from and free) and c filled (config_clear() frees it), or <0
 * with err "FILE:LINE: KEY: message" and c cleared.  client: read no secret file.
 */
int config_core_load(const char *path, bool client, struct cfg_node **ret_root,
		     struct sluice_config *c, char *err, size_t errlen);

/* The first line of a secret file, after checking its mode and owner (nothing for a
 * client).  *ret is owned by the caller. */
int config_read_secret(struct cfg_node *n, const char *file, const struct sluice_config *c,
		       char **ret, char *err, size_t el);

#endif
