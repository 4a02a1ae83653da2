/*
 * control_cmds -- the table of control commands (control_cmds.h).
 */
#include <errno.h>
#include <string.h>

#include "control_cmds.h"
#include "util.h"

#define SELECTION "--domain D (.D: its subdomains) --sender ADDR|@D|'<>'\n" \
	"--older-than DURATION --state deferred|todo|held|uncertain"

const struct control_cmd control_cmds[] = {
	{ "status", NULL, "", "daemon version, uptime, workers, sessions, store, queue", 0 },
	{ "stats", NULL, "",
	  "per service: connections, session duration and work time (min / mean / max /\n"
	  "std-dev), current and peak sessions, errors; classes, store, queue, relay", 0 },
	{ "stats", "--reset", "", "the same, and end the statistics interval now (logged)",
	  CONTROL_CMD_CHANGES },
	{ "decisions", NULL, "", "what each rule decided: checks within and over its limit", 0 },
	{ "top", NULL, "[-n SECONDS] [-b|--batch ITERATIONS]",
	  "live view: sessions, queue, relay, decisions per second per rule, keys\n"
	  "nearest their limits, lanes (q or Ctrl-C quits)", 0 },
	{ "reload", NULL, "", "check the configuration file and reload it", CONTROL_CMD_CHANGES },
	{ "limits", "top", "[RULE]", "the keys nearest their limits", 0 },
	{ "limits", "show", "KEY [RULE]", "a key's state in every rule (or in RULE)", 0 },
	{ "limits", "reset", "KEY [RULE]", "forget a key's counts", CONTROL_CMD_CHANGES },
	{ "limits", "set", "RULE KEY RATE... [--for DURATION]",
	  "a run-time limit for one key of a rule (RATE as in overrides files: 10/1m,\n"
	  "5/30s:10, or 0 for unlimited); it wins over the overrides file and the rule's\n"
	  "rates, is kept by the store (every node with Redis), and ends when unset or\n"
	  "after DURATION (1s to 366d)", CONTROL_CMD_CHANGES },
	{ "limits", "unset", "RULE KEY", "remove a key's run-time limit", CONTROL_CMD_CHANGES },
	{ "limits", "overrides", "[RULE]",
	  "the run-time limits, and the keys of each overrides file (--json: JSON lines)", 0 },
	{ "test", NULL,
	  "[--client-ip IP] [--client-name NAME] [--helo NAME] [--sasl-user USER]\n"
	  "[--from ADDR] [--rcpt ADDR]... [--header 'Name: value']... [--size BYTES]\n"
	  "[--message FILE]",
	  "explain what the rules would do with such a transaction now, without\n"
	  "counting anything (--message: headers and size from a file)", 0 },
	{ "queue", "list", "[ID...|-] [SELECTION]",
	  "the queue (\"list\" may be left out): messages, each recipient's status, next\n"
	  "attempt, last reply (- reads IDs from the input, one a line; --json: JSON lines)",
	  CONTROL_CMD_DEFAULT },
	{ "queue", "show", "ID", "one message: envelope, status bytes, history", 0 },
	{ "queue", "summary", "[SELECTION] [--by sender] [--top N]",
	  "recipients by domain and age (5m ... 1280m+), as qshape", 0 },
	{ "queue", "hold|release|delete|flush|bounce", "ID...|-|--all|SELECTION",
	  "act on messages; SELECTION: " SELECTION, CONTROL_CMD_CHANGES },
	{ "lanes", NULL, "", "the relay's lanes: budget used, next send, state", 0 },
	{ "lanes", "suspend", "NAME [FOR]", "stop a lane (until resumed, or for a duration)",
	  CONTROL_CMD_CHANGES },
	{ "lanes", "resume", "NAME", "lift a lane's suspension", CONTROL_CMD_CHANGES },
	{ "help", NULL, "", "these commands", 0 },
	{ "sendmail", NULL, "[OPTIONS] [RECIPIENT...] < MESSAGE",
	  "queue a message through sluiced's intake, like sendmail(1)\n"
	  "(-t -i -f -F -C -v -B -N -R -V -bm -bs; see sluice(1), INJECTORS)",
	  CONTROL_CMD_LOCAL },
	{ "qmail-remote", NULL, "HOST SENDER RECIPIENT... < MESSAGE",
	  "qmail's qmail-remote(8): queue it, print qmail's reports", CONTROL_CMD_LOCAL },
};
const size_t control_ncmds = ARRAY_SIZE(control_cmds);

/* Is w one of the '|'-separated words of list? */
static bool word_in(struct str w, const char *list)
{
	for (const char *p = list; *p;) {
		size_t n = strcspn(p, "|");
		if (w.len == n && memcmp(w.ptr, p, n) == 0)
			return true;
		p += n + (p[n] == '|');
	}
	return false;
}

/* Words that choose the reply's shape only; the handlers skip them wherever they are. */
static bool is_output_option(struct str w)
{
	return str_eq_cstr(w, "--json") || str_eq_cstr(w, "json");
}

int control_cmd_match(size_t argc, const struct str *argv, const struct control_cmd **ret)
{
	if (argc == 0)
		return -ENOENT;
	const struct str *verb = NULL;
	for (size_t a = 1; a < argc && !verb; a++)
		if (!is_output_option(argv[a]))
			verb = &argv[a];
	const struct control_cmd *bare = NULL, *dflt = NULL;
	for (size_t i = 0; i < control_ncmds; i++) {
		const struct control_cmd *c = &control_cmds[i];
		if ((c->flags & CONTROL_CMD_LOCAL) || !str_eq_cstr(argv[0], c->name))
			continue;
		if (!c->sub) {
			bare = bare ? bare : c;
			continue;
		}
		if (verb && word_in(*verb, c->sub)) {
			*ret = c;
			return 0;
		}
		if ((c->flags & CONTROL_CMD_DEFAULT) && !dflt)
			dflt = c;
	}
	if (!bare && !dflt)
		return -ENOENT;
	*ret = bare ? bare : dflt;
	return 0;
}

bool control_cmd_known(struct str name)
{
	for (size_t i = 0; i < control_ncmds; i++)
		if (!(control_cmds[i].flags & CONTROL_CMD_LOCAL) &&
		    str_eq_cstr(name, control_cmds[i].name))
			return true;
	return false;
}

/* Text with each line after a newline indented by `indent` spaces. */
static int put_lines(struct buf *out, const char *text, int indent)
{
	for (const char *p = text; *p;) {
		size_t n = strcspn(p, "\n");
		if (buf_printf(out, "%.*s", (int)n, p) < 0)
			return -1;
		p += n;
		if (*p == '\n') {
			p++;
			if (buf_printf(out, "\n%*s", indent, "") < 0)
				return -1;
		}
	}
	return 0;
}

int control_cmds_help(struct buf *out, bool with_local)
{
	for (size_t i = 0; i < control_ncmds; i++) {
		const struct control_cmd *c = &control_cmds[i];
		if ((c->flags & CONTROL_CMD_LOCAL) && !with_local)
			continue;
		if (buf_printf(out, "  %s%s%s%s", c->name, c->sub ? " " : "", c->sub ? c->sub : "",
			       *c->args ? " " : "") < 0 ||
		    put_lines(out, c->args, 6) < 0 ||
		    buf_append_cstr(out, "\n        ") < 0 || put_lines(out, c->help, 8) < 0 ||
		    buf_append_cstr(out, (c->flags & CONTROL_CMD_CHANGES) ? " (changes state)\n" : "\n") < 0)
			return -1;
	}
	return 0;
}
