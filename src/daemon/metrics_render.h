/*
 * metrics_render -- sluice's metrics page: what every module counts, in the exposition
 * format (the names, types and labels are listed in sluiced(8), METRICS).
 *
 * Labels carry only names an administrator configured (services, rules, classes, lanes,
 * routes) and fixed words (verdicts, states); never a key, an address or a secret.
 * Everything is read from atomics or under short locks, except the relay's lanes, which
 * its own loop answers (relay_lane_metrics): the caller is the metrics thread, never a
 * worker.
 */
#ifndef SLUICE_METRICS_RENDER_H
#define SLUICE_METRICS_RENDER_H

#include <stdint.h>

#include "buf.h"

struct engine;
struct policy;
struct queue;
struct relay;
struct store;

struct metrics_sources {
	struct engine *engine;
	struct policy *rules;        /* a reference held by the caller */
	struct store *store;
	struct queue *queue;         /* NULL: no queue */
	struct relay *relay;         /* NULL: no route */
	unsigned reloads;
};

/* The whole page, appended to out.  0 or -ENOBUFS (past out's maximum). */
int metrics_render(const struct metrics_sources *src, struct buf *out);

#endif
