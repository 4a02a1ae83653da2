/*
 * lease -- this node's leases in the shared store (see lease.c).
 */
#ifndef SLUICE_LEASE_H
#define SLUICE_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* What the last renewal renewed: the sessions rules' keys renewed with a count, sorted. */
struct lease {
	uint64_t *renewed;
	size_t nrenewed;
};

/*
 * Renew the node's leases in s with its own counts (on the main loop, from a timer):
 * every host class, and every sessions rule's key held now or renewed last time, as one
 * list of (name, count) pairs.  Nothing when s shares no slots.
 */
void lease_renew(struct lease *l, struct store *s);
/* Free what l remembers. */
void lease_clear(struct lease *l);

#endif
