/*
 * relay_control -- the control commands over the relay (relay_control.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cfg.h"
#include "relay_control.h"

static const char *arg_cstr(struct str a, char *tmp, size_t len)
{
	if (a.len >= len)
		a.len = len - 1;
	memcpy(tmp, a.ptr, a.len);
	tmp[a.len] = '\0';
	return tmp;
}

void relay_control(struct relay *r, size_t argc, const struct str *argv, struct buf *out,
		   bool *ret_ok)
{
	*ret_ok = false;
	if (!r) {
		buf_append_cstr(out, "no relay: no route is configured\n");
		return;
	}
	bool json = false;
	struct str args[4];
	size_t nargs = 0;
	for (size_t i = 1; i < argc; i++) {
		if (str_eq_cstr(argv[i], "--json"))
			json = true;
		else if (nargs < 4)
			args[nargs++] = argv[i];
		else {
			buf_append_cstr(out, "usage: lanes [--json] | lanes suspend NAME [FOR] | "
				       "lanes resume NAME\n");
			return;
		}
	}
	if (nargs == 0) {
		int e = relay_lanes(r, json, out);
		if (e < 0)
			buf_printf(out, "lanes: %s\n", strerror(-e));
		*ret_ok = e == 0;
		return;
	}
	char verb[16], name[300];
	arg_cstr(args[0], verb, sizeof(verb));
	bool suspend = strcmp(verb, "suspend") == 0;
	if ((!suspend && strcmp(verb, "resume") != 0) || nargs < 2 || (!suspend && nargs > 2) ||
	    nargs > 3) {
		buf_append_cstr(out, "usage: lanes [--json] | lanes suspend NAME [FOR] | "
			       "lanes resume NAME\n");
		return;
	}
	arg_cstr(args[1], name, sizeof(name));
	int64_t for_ms = 0;
	if (nargs == 3) {
		char text[64], err[200];
		struct cfg_node node = { .kind = CFG_SCALAR, .value = text };
		arg_cstr(args[2], text, sizeof(text));
		node.value_len = strlen(text);
		node.file = "argument";
		node.key = "for";
		if (cfg_duration_ms(&node, 1000, INT64_C(365) * 86400 * 1000, &for_ms, err,
				    sizeof(err)) < 0) {
			buf_printf(out, "lanes suspend: \"%s\": expected a duration such as 30m\n",
				   text);
			return;
		}
	}
	int e = suspend ? relay_lane_suspend(r, name, for_ms) : relay_lane_resume(r, name);
	if (e == -ENOENT) {
		buf_printf(out, "no lane named \"%s\" (see sluice lanes)\n", name);
		return;
	}
	if (e < 0) {
		buf_printf(out, "lanes %s: %s\n", verb, strerror(-e));
		return;
	}
	buf_printf(out, "lane %s %s\n", name, suspend ? "suspended" : "resumed");
	*ret_ok = true;
}

void relay_control_stats(struct relay *r, bool json, struct buf *out)
{
	if (!r)
		return;
	struct relay_stats st;
	relay_stats(r, &st);
	if (json)
		buf_printf(out, ",\"relay\":{\"transactions\":%" PRIu64 ",\"delivered\":%" PRIu64
			   ",\"failed\":%" PRIu64 ",\"deferred\":%" PRIu64 ",\"uncertain\":%" PRIu64
			   ",\"suspensions\":%" PRIu64 ",\"dsn_sent\":%" PRIu64 ",\"dsn_skipped\":%"
			   PRIu64 ",\"connections\":%" PRIu64 ",\"active_connections\":%u,"
			   "\"lanes\":%u}", st.transactions, st.delivered, st.failed, st.deferred,
			   st.uncertain, st.suspensions, st.dsn_sent, st.dsn_skipped, st.connections,
			   st.active_connections, st.lanes);
	else
		buf_printf(out, "relay: %" PRIu64 " transactions, %" PRIu64 " delivered, %" PRIu64
			   " failed, %" PRIu64 " deferred, %" PRIu64 " uncertain,\n  %" PRIu64
			   " suspensions, %" PRIu64 " bounces (%" PRIu64 " not sent: null sender),\n  %"
			   PRIu64 " connections (%u open), %u lanes\n", st.transactions, st.delivered,
			   st.failed, st.deferred, st.uncertain, st.suspensions, st.dsn_sent,
			   st.dsn_skipped, st.connections, st.active_connections, st.lanes);
}
