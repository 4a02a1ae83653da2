/*
 * milter_static -- the handler shipped until rules exist: fixed replies per step, and
 * fixed modifications at end of message, for testing an MTA's integration.
 *
 * Only the steps given a reply are negotiated (the MTA skips the others); with nothing
 * configured the handler accepts every message at end of message.
 */
#ifndef SLUICE_MILTER_STATIC_H
#define SLUICE_MILTER_STATIC_H

#include "cfg_schema.h"
#include "milter_session.h"

struct milter_static_conf {
	bool set[MILTER_STEP_COUNT];
	enum milter_verdict verdict[MILTER_STEP_COUNT];
	char *reply[MILTER_STEP_COUNT]; /* for MILTER_REPLY; owned */
	/* Modifications at EOM; each list NULL-terminated and owned. */
	char **add_header;    /* "Name: value" */
	char **insert_header; /* "INDEX Name: value" */
	char **change_header; /* "INDEX Name: value" (empty value deletes) */
	char **add_rcpt;      /* "<addr>" */
	char **add_rcpt_par;  /* "<addr> ESMTP-ARGS" */
	char **del_rcpt;      /* "<addr>" */
	char *change_from;    /* "<addr> [ESMTP-ARGS]" */
	char *replace_body;
	char *quarantine;
};

void milter_static_conf_clear(struct milter_static_conf *c);

/*
 * The keys of milter { reply { } modify { } } (cfg_schema.h), over a struct
 * milter_static_conf: reply's keys are the steps, each an action as
 * milter_static_parse_action() reads it; modify's the lists above, each item checked
 * with its line.  milter_static_keys holds both blocks, for sluiced -D.
 */
extern const struct cfg_key milter_static_reply_keys[], milter_static_modify_keys[],
	milter_static_keys[];

/*
 * Parse "continue" | "accept" | "reject" | "tempfail" | "discard" | "skip" | an SMTP reply
 * "4xx/5xx ..." for a step.  Returns 0 or -EINVAL with *ret_why.  *ret_reply is a malloc'ed
 * copy for replies, NULL otherwise.
 */
int milter_static_parse_action(const char *text, enum milter_step step,
			       enum milter_verdict *ret_verdict, char **ret_reply,
			       const char **ret_why);

/* Check "INDEX Name: value" / "Name: value" / "<addr> args" forms; 0 or -EINVAL. */
int milter_static_check_header(const char *text, bool indexed, const char **ret_why);

/* A handler taking ownership of *conf's contents (conf is cleared). */
struct milter_handler *milter_static_new(struct milter_static_conf *conf);

#endif
