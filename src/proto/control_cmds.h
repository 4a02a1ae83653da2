/*
 * control_cmds -- the table of control commands: what `sluice` may ask of sluiced.
 *
 * One row per form of a command, as the operator types it after `sluice`: its words
 * (the command and, for some, a subcommand or the one option that makes it another
 * form, as `stats --reset`), its arguments, one line of help, and whether it changes
 * the daemon's state.  The daemon dispatches on the first word and checks access on the
 * form a request is (control_cmd_match(): control { admin = "root"; } and the read-only
 * password let others run only the forms that change nothing); `sluice --help`, the
 * daemon's `help` reply and the test that holds sluice(1) to it all read these rows.  The handlers are the daemon's: this
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
	CONTROL_CMD_DEFAULT = 1 << 2, /* the subcommand may be left out ("queue" is "queue
				       * list"): the form of a request whose word at the
				       * subcommand's place is none of the command's */
};

struct control_cmd {
	const char *name;  /* the first word: what the daemon dispatches on */
	const char *sub;   /* the subcommand words, "a|b", or NULL: what the word at the
			    * subcommand's place may be for this form */
	const char *args;  /* the arguments after them, for the help ("" for none) */
	const char *help;  /* what it does; '\n' starts another line */
	unsigned flags;
};

extern const struct control_cmd control_cmds[];
extern const size_t control_ncmds;

/*
 * The form a request is, by position, as the handlers read it: its first word is the
 * name; the word at the subcommand's place is the first after the name that is not
 * --json or json (which choose only the reply's shape, and may stand anywhere); a row
 * whose sub holds that word is the form; else the name's row without sub, else its
 * CONTROL_CMD_DEFAULT row.  The arguments after those words do not change the form: a
 * key or a rule named "set" or "reset" stays an argument.  0 with *ret, or -ENOENT (no
 * row: an unknown name, a CONTROL_CMD_LOCAL one, or a word at the subcommand's place
 * that the name has no form for); the caller refuses an unknown form to a peer that may
 * only read, so that a form added to a handler and not to this table fails closed.
 */
int control_cmd_match(size_t argc, const struct str *argv, const struct control_cmd **ret);

/* Is there a row for this first word (sent to the daemon, not CONTROL_CMD_LOCAL)? */
bool control_cmd_known(struct str name);

/* The rows as help: "  name sub args" then the help lines indented; the rows the
 * daemon runs only, or all of them (`sluice --help`). */
int control_cmds_help(struct buf *out, bool with_local);

#endif
