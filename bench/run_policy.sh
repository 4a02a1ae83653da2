#!/usr/bin/env bash
# run_policy.sh -- the policy benchmark: sluiced's Postfix policy service against its
# milter service, both deciding the same five limit rules.
#
# Usage: bench/run_policy.sh [BUILD_DIR]        (default ./build)
#
# One sluiced runs with a policy listener and a milter listener on unix sockets in a
# temporary directory, and five limit rules (keyed on rcpt_domain, sender_domain,
# client_ip, client_ip/24 and sender+rcpt_domain) whose rates are so generous that
# nothing is refused: what is measured is the cost of deciding.  policy_load and then
# milter_load drive it for the same duration at the same concurrency, and the result
# is a markdown table on stdout; progress and problems go to stderr.  See
# bench/README.md, "The rule benchmark".
#
# Environment: BENCH_DURATION (seconds measured, default 5), BENCH_WARMUP (default 1),
# BENCH_CONCURRENCY (default 100), BENCH_RCPTS (recipients per message or SMTP session,
# default 3), BENCH_DOMAINS (recipient domains of policy_load, default 3: milter_load
# sends its three recipients to dom0, dom1 and dom2), BENCH_RATE (the rate of every
# rule, default 1000000000/1m), BENCH_EXTRA_CONF (lines appended to sluiced's configuration), BENCH_KEEP=1 (keep the
# temporary directory: configuration, log, JSON lines).

set -u
PROG=run_policy
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD=${1:-./build}
DURATION=${BENCH_DURATION:-5}
WARMUP=${BENCH_WARMUP:-1}
CONC=${BENCH_CONCURRENCY:-100}
RCPTS=${BENCH_RCPTS:-3}
DOMAINS=${BENCH_DOMAINS:-3}
RATE=${BENCH_RATE:-1000000000/1m}

MILTER_LOAD=$BUILD/bench/milter_load
POLICY_LOAD=$BUILD/bench/policy_load
SLUICED=$BUILD/src/daemon/sluiced

need_built "$MILTER_LOAD" "$POLICY_LOAD" "$SLUICED"
bench_tmpdir
nofile_max

# ---- sluiced --------------------------------------------------------------------------

CONF=$DIR/sluice.conf
LOG=$DIR/sluiced.log
{
	sluiced_conf_head "$DIR" state
	cat <<EOF
policy { listen = "unix:$DIR/policy.sock"; }
milter { listen = "unix:$DIR/milter.sock"; max_sessions = 30000; }
EOF
	# The five rules, all decided at RCPT so that both services decide all five per
	# recipient (a policy request arrives at RCPT with every attribute).
	rules_conf "$RATE"
	[ -z "${BENCH_EXTRA_CONF:-}" ] || printf '%s\n' "$BENCH_EXTRA_CONF"
} > "$CONF"

if ! "$SLUICED" -t -c "$CONF" > "$DIR/check.log" 2>&1; then
	say "sluiced does not accept the benchmark configuration (are the policy {} and"
	say "limit blocks implemented in this build?):"
	sed 's/^/    /' "$DIR/check.log" >&2
	exit 1
fi

"$SLUICED" -c "$CONF" 2>>"$LOG" &
PID[sluiced]=$!
started sluiced sluiced "$LOG" "$DIR/policy.sock" "$DIR/milter.sock" || exit 1

# ---- measuring ------------------------------------------------------------------------

ROWS=()
PROTO=

# run_one NAME OUT COMMAND...: one load run; 0 if it produced a JSON line.
run_one() {
	local name=$1 out=$2
	shift 2
	if ! kill -0 "${PID[sluiced]}" 2>/dev/null; then
		say "sluiced is no longer running; its log:"
		tail -n 20 "$LOG" >&2
		ROWS+=("| $name | $CONC | - | - | - | - | - | - | - | - | sluiced died |")
		return 1
	fi
	say "$name: concurrency $CONC, ${DURATION}s"
	load_run "$name" "$out" "load generator" "$@" && return 0
	ROWS+=("| $name | $CONC | - | - | - | - | - | - | - | - | failed: $LOAD_FAILED |")
	return 1
}

# row NAME UNIT RATE CHECKS_PER_UNIT P50 P99 THREADS RSS_KB CPU_PER_UNIT REFUSED ERRORS
row() {
	ROWS+=("$(awk -v n="$1" -v u="$2" -v r="$3" -v k="$4" -v p50="$5" -v p99="$6" \
	    -v t="$7" -v rss="$8" -v cpu="$9" -v ref="${10}" -v e="${11}" -v c="$CONC" \
	    'BEGIN { printf "| %s | %s | %.0f %s/s | %.0f | %.3f | %.3f | %s | %.1f | %.1f | %s | %s |",
	        n, c, r, u, r * k, p50, p99, t, rss / 1024, cpu / k, ref, e }')")
}

out=$DIR/policy.json
if run_one policy "$out" "$POLICY_LOAD" -c "$CONC" -t "$DURATION" -w "$WARMUP" \
    -r "$RCPTS" -d "$DOMAINS" --json --label policy --pid "${PID[sluiced]}" "unix:$DIR/policy.sock"; then
	req=$(jget requests "$out")
	row policy req "$(jget requests_per_s "$out")" 1 "$(jget p50 "$out")" \
	    "$(jget p99 "$out")" "$(jget threads_max "$out")" "$(jget rss_kb_max "$out")" \
	    "$(jget cpu_us_per_request "$out")" "$((req - $(jget DUNNO "$out")))" \
	    "$(jget total "$out")"
fi

out=$DIR/milter.json
if run_one milter "$out" "$MILTER_LOAD" -c "$CONC" -t "$DURATION" -w "$WARMUP" \
    -r "$RCPTS" --json --label milter --pid "${PID[sluiced]}" "unix:$DIR/milter.sock"; then
	msgs=$(jget messages "$out")
	row milter session "$(jget sessions_per_s "$out")" "$RCPTS" "$(jget p50 "$out")" \
	    "$(jget p99 "$out")" "$(jget threads_max "$out")" "$(jget rss_kb_max "$out")" \
	    "$(jget cpu_us_per_session "$out")" "$((msgs - $(jget accept "$out")))" \
	    "$(jget total "$out")"
	PROTO=$(printf '0x%08x' "$(jget protocol "$out")")
fi

# ---- the table ----------------------------------------------------------------------------

echo "## policy benchmark"
echo
echo "$(machine)" \
    "${DURATION}s per row after ${WARMUP}s warm-up; one sluiced, five limit rules at RCPT" \
    "(rcpt_domain, sender_domain, client_ip, client_ip/24, sender+rcpt_domain; $RATE each)."
echo
echo "| service | concurrency | rate | rcpt decisions/s | p50 ms | p99 ms | threads | RSS MiB | CPU µs/decision | refused | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
printf '%s\n' "${ROWS[@]}"
echo
echo "- policy: one request per recipient on $CONC kept connections (as $CONC smtpd processes);"
echo "  latency per request; refused = replies other than DUNNO."
echo "- milter: a new connection per SMTP session of $RCPTS recipients; latency per session"
echo "  (connect to end-of-message reply); CPU per decision = CPU per session / $RCPTS, so it"
echo "  carries the session's other steps; refused = messages not accepted (a refused"
echo "  recipient shows only when all $RCPTS are)."
[ -z "$PROTO" ] || echo "- the milter negotiated protocol flags $PROTO."
echo "- threads and RSS are sluiced's peaks during each run; CPU is its utime+stime over the"
echo "  run divided by the requests or sessions completed in it."
