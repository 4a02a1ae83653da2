/*
 * control_cmds -- the table of control commands: what `sluice` may ask of sluiced.
 *
 * One row per form of a command, as the operator types it after `sluice`: its words
 * (the command and, for some, a subcommand), its arguments, one line of help, and
 * whether it changes the daemon's state.  The daemon dispatches on the first word and
 * checks access from the flags (control { admin = "root"; } lets others run only the
 * forms that change nothing); `sluice --help`, the daemon's `help` reply and the test
 * that holds sluice(1) to it all read these rows.  The handlers are the daemon's: this
 * file is data, so that the `sluice` command links it without the daemon.
 */
#ifndef SLUICE_PROTO_CONTROL_CMDS_H
#define SLUICE_PROTO_CONTROL_CMDS_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "str.h"

enum {
	CONTROL_CMD_CHANGES = 1 << 0, /* changes state: admin only */
	CONTROL_CMD_LOCAL = 1 << 1,   /* run by `sluice` itself, never sent to the daemon */
};

struct control_cmd {
	const char *name;  /* the first word: what the daemon dispatches on */
	const char *sub;   /* the subcommand words, "a|b", or NULL */
	const char *args;  /* the arguments after them, for the help ("" for none) */
	const char *help;  /* what it does; '\n' starts another line */
	unsigned flags;
};

extern const struct control_cmd control_cmds[];
extern const size_t control_ncmds;

/*
 * Does the request change state?  It does when a CONTROL_CMD_CHANGES row has its name
 * and either no subcommand or one of its subcommand words among the arguments.
 */
bool control_cmd_changes_state(size_t argc, const struct str *argv);

/* Is there a row for this first word (sent to the daemon, not CONTROL_CMD_LOCAL)? */
bool control_cmd_known(struct str name);

/* The rows as help: "  name sub args" then the help lines indented; the rows the
 * daemon runs only, or all of them (`sluice --help`). */
int control_cmds_help(struct buf *out, bool with_local);

#endif
