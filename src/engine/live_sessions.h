/*
 * live_sessions -- the SMTP sessions the milter and the Postfix policy service serve
 * right now, by the client's address and port, to tell when one MTA uses both for the
 * same sessions (it then decides, and counts, every event twice).
 *
 * Either side may come first: Postfix writes a milter event that awaits no reply (CONNECT,
 * HELO, MAIL without rules) only with the next one that does, so the policy service may
 * be asked at RCPT before the milter hears of the session.  So each side records the
 * sessions it serves -- the milter from CONNECT to the session's end, the policy service
 * the current SMTP session of each of its connections -- and the first moment both hold
 * one session, it is counted, once.
 *
 * One table per process, shared by every worker: fixed size (LIVE_SESSIONS_MAX entries in
 * LIVE_SESSIONS_STRIPES stripes, each under its own lock), so it never grows with the
 * connections; a session whose stripe is full is not recorded (this is a diagnosis, not a
 * decision).  Every operation costs at most one stripe's scan (law 8).  It lives below the
 * milter and the policy service, which may not use each other (doc/ARCHITECTURE.md).
 */
#ifndef SLUICE_LIVE_SESSIONS_H
#define SLUICE_LIVE_SESSIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "ipaddr.h"
#include "str.h"

#define LIVE_SESSIONS_STRIPES 64
#define LIVE_SESSIONS_MAX 4096

/* What the side that sees a double use first logs (once per process). */
#define LIVE_SESSIONS_WARNING                                                            \
	"the milter and the policy service both serve the same SMTP sessions: each message " \
	"is counted by both; use one of them for limits (doc/POSTFIX.md, `sluice status`)"

enum live_side {
	LIVE_MILTER = 0,
	LIVE_POLICY,
	LIVE_SIDES,
};

struct live_session_key {
	struct ipaddr ip;
	uint16_t port;
};

/* The key of a session from the client's address as an MTA writes it (ipaddr_parse())
 * and its port: 0 and *ret, or -EINVAL when there is none (no address, port 0). */
int live_sessions_key(struct str addr, unsigned port, struct live_session_key *ret);
/*
 * side serves the session k from now on.  Returns 0 (recorded), 1 (recorded, and the
 * other side serves it too: counted now, once per session), or -ENOSPC (its stripe is
 * full: not recorded, do not leave).
 */
int live_sessions_enter(const struct live_session_key *k, enum live_side side);
/* side no longer serves k (once per recorded live_sessions_enter()). */
void live_sessions_leave(const struct live_session_key *k, enum live_side side);
/* Does side serve a session with this key? */
bool live_sessions_has(const struct live_session_key *k, enum live_side side);
/* Sessions the side serves now, as recorded. */
unsigned live_sessions_count(enum live_side side);
/* SMTP sessions that both sides served, since start. */
uint64_t live_sessions_doubles(void);
/* True exactly once per process: the caller that gets it logs LIVE_SESSIONS_WARNING. */
bool live_sessions_claim_warning(void);

#endif
