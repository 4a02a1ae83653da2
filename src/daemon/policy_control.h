/*
 * policy_control -- the control commands over the rule set and the limiter store:
 * `limits top|show|reset`, `test` (explain a hypothetical transaction), and the class and
 * store part of `stats`.
 */
#ifndef SLUICE_POLICY_CONTROL_H
#define SLUICE_POLICY_CONTROL_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "control_service.h"
#include "policy.h"
#include "store.h"
#include "str.h"

/* Both return 0 (answered), or 1 when the answer comes through w (a shared store). */
int policy_control_limits(struct policy *p, size_t argc, const struct str *argv,
			  struct buf *out, bool *ret_ok, struct control_wait *w);
/* test NAME=VALUE... with values %XX-encoded: client_ip, client_name, helo, sasl_user,
 * from, rcpt (repeated), header ("Name: value", repeated), size. */
int policy_control_test(struct policy *p, size_t argc, const struct str *argv,
			struct buf *out, bool *ret_ok, struct control_wait *w);
void policy_control_stats(struct policy *p, struct store *s, bool json, struct buf *out);
/* `decisions`: what each rule decided since the rule set was loaded. */
void policy_control_decisions(struct policy *p, bool json, struct buf *out);
/* The rules' part of `top`: "rule NAME STAGE ACTION PASSED OVER" lines, then up to max_keys
 * "key ..." lines (the keys nearest their limits), or "keys-shared" with a shared store. */
void policy_control_top(struct policy *p, size_t max_keys, struct buf *out);

#endif
