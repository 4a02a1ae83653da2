/*
 * relay_control -- `sluice lanes [--json]`, `sluice lanes suspend NAME [FOR]`,
 * `sluice lanes resume NAME`, and the relay's part of `stats`.
 */
#ifndef SLUICE_RELAY_CONTROL_H
#define SLUICE_RELAY_CONTROL_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "relay.h"
#include "str.h"

/* r may be NULL (no route configured: the command says so). */
void relay_control(struct relay *r, size_t argc, const struct str *argv, struct buf *out,
		   bool *ret_ok);
/* json: ,"relay":{...} inside the stats object; text: a paragraph.  r may be NULL. */
void relay_control_stats(struct relay *r, bool json, struct buf *out);

#endif
