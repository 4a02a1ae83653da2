/*
 * daemon_config -- sluiced's whole configuration: what src/conf loads (struct
 * sluice_config, all the sluice command reads) and, beside it, what needs the code of
 * the modules above the conf layer: the compiled rule set (limit and class blocks), the
 * milter's fixed answers (milter { reply {} modify {} }) and the relay's configuration
 * (relay {}, route and provider blocks).  Each of those modules declares its blocks' keys
 * next to its code; daemon_config_load() assembles them and checks what spans them.
 *
 * Every struct sluice_config in sluiced is the conf of a struct daemon_config made by
 * daemon_config_load(): the daemon passes &conf where only the lower part matters and
 * finds the rest with daemon_config_of().  Loading is all or nothing, and a loaded
 * configuration is immutable; a reload builds a new one.
 */
#ifndef SLUICE_DAEMON_CONFIG_H
#define SLUICE_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "milter_static.h"
#include "policy.h"
#include "relay.h"

struct daemon_config {
	struct sluice_config conf;           /* first: see daemon_config_of() */
	struct policy *rules;                /* limit and class blocks (never NULL) */
	struct milter_static_conf milter_handler; /* milter { reply {} modify {} } */
	bool milter_static;                  /* reply {} or modify {} given */
	struct relay_conf relay;             /* relay {} and route blocks; no route: no relay */
	bool has_relay;                      /* a relay {} block was given */
	bool relay_hostname_derived;         /* relay.hostname: not given, found by sluiced */
};

/* Load and check a file.  0 and *ret (&conf of a new struct daemon_config), or <0 with
 * err "FILE:LINE: KEY: message" and nothing returned. */
int daemon_config_load(const char *path, struct sluice_config **ret, char *err, size_t errlen);
/* The daemon_config that c is the conf of (c from daemon_config_load()). */
static inline struct daemon_config *daemon_config_of(const struct sluice_config *c)
{
	_Static_assert(offsetof(struct daemon_config, conf) == 0, "conf is first");
	return (struct daemon_config *)(uintptr_t)c;
}
/* Frees the daemon_config c is the conf of; NULL accepted.  Returns NULL. */
struct sluice_config *daemon_config_free(struct sluice_config *c);
/*
 * sluiced -n and -D: c in sluice.conf syntax, every block it has with every key
 * (all = true) or what differs from the defaults (all = false), the daemon's blocks
 * after src/conf's (config_print()).
 */
void daemon_config_print(FILE *f, const struct sluice_config *c, bool all);

#endif
