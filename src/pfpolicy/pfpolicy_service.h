/*
 * pfpolicy_service -- the Postfix SMTPD policy-delegation server, on the engine.
 *
 * Each smtpd process keeps one connection and sends one request at a time; a connection
 * outlives SMTP sessions, so SMTP sessions are told apart by their endpoints (client and
 * server address and port) and messages by the `instance` attribute.  Stages come from
 * protocol_state: a request at a stage runs that stage's rules, and first the rules of
 * earlier stages not yet run -- connect and helo once per SMTP session, mail once per
 * message -- because with smtpd_delay_reject (Postfix's default) most checks arrive at
 * RCPT.  A message's
 * charges are given back when sluice refuses it at DATA or END-OF-MESSAGE.
 */
#ifndef SLUICE_PFPOLICY_SERVICE_H
#define SLUICE_PFPOLICY_SERVICE_H

#include <stddef.h>

#include "engine.h"
#include "policy.h"

struct pfpolicy_conf {
	size_t max_request; /* bytes of one request */
};

/* The service with an initial rule set (a reference is taken).  NULL on failure. */
struct service *pfpolicy_service_new(struct engine *e, struct policy *p,
				     const struct pfpolicy_conf *conf);
/* A new rule set (reference taken) for messages that start from now on. */
void pfpolicy_service_set_policy(struct service *svc, struct policy *p);
void pfpolicy_service_set_conf(struct service *svc, const struct pfpolicy_conf *conf);

#endif
