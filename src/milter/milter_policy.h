/*
 * milter_policy -- the milter handler that answers from the rule set (src/policy).
 *
 * It negotiates only the steps its rules need, builds the transaction view the selectors
 * read from the session, takes a host-class slot at CONNECT (refusing with 421 when the
 * class is full) and gives it back when the MTA ends the session, asks the policy at each
 * stage that has rules, and keeps the per-message ledger so an aborted or refused message
 * gives back what it was counted for.  Tags and quarantine are applied at end of message.
 */
#ifndef SLUICE_MILTER_POLICY_H
#define SLUICE_MILTER_POLICY_H

#include "milter_session.h"
#include "policy.h"

/* A handler over p (a reference is taken).  NULL on allocation failure. */
struct milter_handler *milter_policy_new(struct policy *p);

#endif
