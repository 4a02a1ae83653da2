#!/usr/bin/env bash
# run_rules.sh -- what limit rules cost: milter_load against (a) sluiced with no rules,
# (b) sluiced with five limit rules, (d) the same with a distinct-count and a sessions
# rule more, and (c) counter_milter, the libmilter rate limit a mail administrator
# writes, side by side in one run.
#
# Usage: bench/run_rules.sh [BUILD_DIR]         (default ./build)
#
# The filters run at once on unix sockets in a temporary directory; milter_load drives
# one at a time, BENCH_ROUNDS rounds in turn (a, b, c, null, a, b, c, ...), so that a
# slow moment of the machine does not land on one filter only.  Each filter's row holds
# the medians over the rounds.  The table ends with the ratios (b)/(a) -- what the rules
# cost sluiced -- and (b)/(c) -- sluiced with five rules against one rule on libmilter.
# See bench/README.md, "The rule benchmark".
#
# A fourth row, null_milter (run_milter.sh's libmilter filter, which does nothing), shows
# what counting costs libmilter, as (a) does for sluiced: the ratio (c)/null_milter.
#
# The four filters negotiate the same round trips.  Rules decided at RCPT make (b)
# negotiate CONNECT, HELO and MAIL without a reply (their values go into the decision log
# lines), RCPT and end-of-message, and skip the rest (protocol 0x00007370); counter_milter
# and null_milter are told to do the same (-s connect,helo,mail,rcpt,eom
# -R connect,helo,mail).  sluiced refuses a reply block next to rules, and a reply block
# cannot negotiate a step without a reply, so (a) answers RCPT and end-of-message and skips
# CONNECT, HELO and MAIL (0x00000377): it is spared those packets, which cost no round
# trip.  The # footnotes show each filter's flags and warn when they differ beyond that.
#
# Environment: BENCH_DURATION (seconds per run, default 5), BENCH_WARMUP (default 1),
# BENCH_CONCURRENCY (default 100), BENCH_ROUNDS (default 3), BENCH_RATE (the rate of
# every rule, default 1000000000/1m), BENCH_FILTERS (the filters to run, default
# "norules rules rules7 counter null"), BENCH_EXTRA_CONF (lines appended to both sluiced
# configurations), BENCH_KEEP=1 (keep the temporary directory: configurations, logs,
# one JSON line per run).

set -u
PROG=run_rules
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD=${1:-./build}
DURATION=${BENCH_DURATION:-5}
WARMUP=${BENCH_WARMUP:-1}
CONC=${BENCH_CONCURRENCY:-100}
ROUNDS=${BENCH_ROUNDS:-3}
RATE=${BENCH_RATE:-1000000000/1m}

LOAD=$BUILD/bench/milter_load
COUNTER=$BUILD/bench/counter_milter
NULL_MILTER=$BUILD/bench/null_milter
SLUICED=$BUILD/src/daemon/sluiced

need_built "$LOAD"
bench_tmpdir
read -r -a NAMES <<<"${BENCH_FILTERS:-norules rules rules7 counter null}"
declare -A SOCK NOTE LABEL
LABEL[norules]="(a) sluiced, no rules"
LABEL[rules]="(b) sluiced, 5 rules"
LABEL[rules7]="(d) sluiced, 7 rules"
LABEL[counter]="(c) counter_milter, 1 rule"
LABEL[null]="null_milter, no rules"

nofile_max

# ---- the filters ----------------------------------------------------------------------

# (a): the round trips (b) has, without rules.
REPLY_BLOCK='  reply { rcpt = "continue"; eom = "accept"; }'
# counter_milter and null_milter: the steps (b) negotiates.
LIBMILTER_STEPS=(-s 'connect,helo,mail,rcpt,eom' -R 'connect,helo,mail')

# sluiced_conf NAME: the configuration of filter NAME (norules or rules) on stdout.
sluiced_conf() {
	local d=$DIR/$1
	sluiced_conf_head "$d" state
	cat <<EOF
milter {
  listen = "unix:$d/milter.sock";
  max_sessions = 30000;
EOF
	[ "$1" != norules ] || echo "$REPLY_BLOCK"
	echo "}"
	[ "$1" = norules ] || rules_conf "$RATE"
	[ "$1" != rules7 ] || rules7_conf "$RATE"
	[ -z "${BENCH_EXTRA_CONF:-}" ] || printf '%s\n' "$BENCH_EXTRA_CONF"
}

start_sluiced() {               # start_sluiced norules|rules|rules7
	local name=$1 d=$DIR/$1
	mkdir -p "$d"
	sluiced_conf "$name" > "$d/sluice.conf"
	if ! "$SLUICED" -t -c "$d/sluice.conf" > "$d/check.log" 2>&1; then
		say "$name: sluiced does not accept its configuration:"
		sed 's/^/    /' "$d/check.log" >&2
		NOTE[$name]="configuration refused: $(tail -n 1 "$d/check.log" | sed "s|$d/||" | cut -c 1-90)"
		return 1
	fi
	"$SLUICED" -c "$d/sluice.conf" 2>>"$d/sluiced.log" &
	PID[$name]=$!
	SOCK[$name]=$d/milter.sock
	started "$name" "$name: sluiced" "$d/sluiced.log" "$d/milter.sock" ||
	    { NOTE[$name]="failed to start"; return 1; }
}

start_libmilter() {             # start_libmilter NAME PROGRAM [ARGS...]: counter or null
	local name=$1 prog=$2 d=$DIR/$1
	shift 2
	mkdir -p "$d"
	"$prog" -p "unix:$d/milter.sock" "$@" 2>>"$d/$name.log" &
	PID[$name]=$!
	SOCK[$name]=$d/milter.sock
	started "$name" "$name" "$d/$name.log" "$d/milter.sock" ||
	    { NOTE[$name]="failed to start"; return 1; }
}

for n in "${NAMES[@]}"; do
	case $n in
	norules|rules|rules7)
		if [ -x "$SLUICED" ]; then
			start_sluiced "$n"
		else
			NOTE[$n]="not built ($SLUICED missing)"
		fi ;;
	counter|null)
		prog=$COUNTER
		[ "$n" = counter ] || prog=$NULL_MILTER
		if [ -x "$prog" ]; then
			start_libmilter "$n" "$prog" "${LIBMILTER_STEPS[@]}"
		else
			NOTE[$n]="not built (libmilter-dev missing when $BUILD was configured)"
		fi ;;
	*)
		die "BENCH_FILTERS: unknown filter $n (norules, rules, rules7, counter, null)" ;;
	esac
done
any=
for n in "${NAMES[@]}"; do
	any=$any${PID[$n]:-}
done
[ -n "$any" ] || die "no filter to measure"

# ---- measuring ------------------------------------------------------------------------

for r in $(seq 1 "$ROUNDS"); do
	for n in "${NAMES[@]}"; do
		pid=${PID[$n]:-}
		[ -n "$pid" ] || continue
		if ! kill -0 "$pid" 2>/dev/null; then
			say "$n: the filter died"
			NOTE[$n]="died during the run"
			PID[$n]=
			continue
		fi
		out=$DIR/$n-r$r.json
		say "$n: round $r of $ROUNDS, concurrency $CONC, ${DURATION}s"
		if ! load_run "$n" "$out" milter_load "$LOAD" -c "$CONC" -t "$DURATION" -w "$WARMUP" \
		    --json --label "$n" --pid "$pid" "unix:${SOCK[$n]}"; then
			NOTE[$n]="milter_load failed: $LOAD_FAILED"
			rm -f "$out"
		fi
	done
done

# ---- the table ----------------------------------------------------------------------------

# agg NAME: "rate p50 p99 threads rss_kb cpu refused errors runs proto" over NAME's runs:
# medians of rate, latencies and CPU; peaks of threads and RSS; sums of the counts.
agg() {
	local f
	for f in "$DIR/$1"-r*.json; do
		[ -s "$f" ] || continue
		printf '%s %s %s %s %s %s %s %s %s\n' "$(jget sessions_per_s "$f")" \
		    "$(jget p50 "$f")" "$(jget p99 "$f")" "$(jget threads_max "$f")" \
		    "$(jget rss_kb_max "$f")" "$(jget cpu_us_per_session "$f")" \
		    "$(( $(jget messages "$f") - $(jget accept "$f") ))" "$(jget total "$f")" \
		    "$(jget protocol "$f")"
	done | awk '
		function median(a, n,   i, j, t) {
			for (i = 2; i <= n; i++)
				for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		{ n++; rate[n] = $1; p50[n] = $2; p99[n] = $3; cpu[n] = $6
		  if ($4 > thr) thr = $4; if ($5 > rss) rss = $5; ref += $7; err += $8
		  if (proto == "") proto = $9; else if (proto != $9) proto = "mixed" }
		END { if (n) printf "%.1f %.3f %.3f %d %d %.1f %d %d %d %s\n", median(rate, n),
		        median(p50, n), median(p99, n), thr, rss, median(cpu, n), ref, err, n, proto }'
}

declare -A RATE_OF P99_OF CPU_OF PROTO_OF
ROWS=()
for n in "${NAMES[@]}"; do
	read -r rate p50 p99 thr rss cpu ref err runs proto <<<"$(agg "$n")"
	if [ -z "${runs:-}" ]; then
		ROWS+=("| ${LABEL[$n]} | - | - | - | - | - | - | - | - | ${NOTE[$n]:-no run} |")
		continue
	fi
	RATE_OF[$n]=$rate
	P99_OF[$n]=$p99
	CPU_OF[$n]=$cpu
	[ "$proto" = mixed ] && PROTO_OF[$n]=mixed || PROTO_OF[$n]=$(printf '0x%08x' "$proto")
	ROWS+=("$(awk -v l="${LABEL[$n]}" -v r="$rate" -v p50="$p50" -v p99="$p99" -v t="$thr" \
	    -v rss="$rss" -v cpu="$cpu" -v ref="$ref" -v e="$err" -v runs="$runs" \
	    -v note="${NOTE[$n]:-}" 'BEGIN {
	        printf "| %s | %.0f | %.3f | %.3f | %d | %.1f | %.0f | %d | %d | %d%s |",
	            l, r, p50, p99, t, rss / 1024, cpu, runs, ref, e, note == "" ? "" : " (" note ")" }')")
done

# ratio NUM DEN: NUM/DEN with two decimals, or "-".
ratio() {
	if [ -n "${1:-}" ] && [ -n "${2:-}" ]; then
		awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'
	else
		echo "-"
	fi
}

echo "## rule benchmark"
echo
echo "$(machine) milter_load at" \
    "concurrency $CONC, ${DURATION}s per run after ${WARMUP}s warm-up, rounds: $ROUNDS; each" \
    "session: new unix-socket connection, OPTNEG, CONNECT, HELO and MAIL (no reply; (a)" \
    "skips them and gets their MACRO packets only), 3 RCPT, end-of-message, QUIT."
echo
echo "| filter | sessions/s | p50 ms | p99 ms | threads | RSS MiB | CPU µs/session | runs | refused | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
printf '%s\n' "${ROWS[@]}"
echo
echo "| ratio | sessions/s | p99 | CPU/session |"
echo "|---|---:|---:|---:|"
ratio_row() {                   # ratio_row TEXT NUM DEN
	echo "| $1 | $(ratio "${RATE_OF[$2]:-}" "${RATE_OF[$3]:-}") |" \
	    "$(ratio "${P99_OF[$2]:-}" "${P99_OF[$3]:-}") |" \
	    "$(ratio "${CPU_OF[$2]:-}" "${CPU_OF[$3]:-}") |"
}
ratio_row "(b)/(a): what five rules cost sluiced" rules norules
ratio_row "(d)/(a): what seven rules (with distinct and sessions) cost sluiced" rules7 norules
ratio_row "(d)/(b): what the distinct and sessions rules add" rules7 rules
ratio_row "(b)/(c): sluiced with five rules / libmilter with one" rules counter
ratio_row "(c)/null_milter: what one rule costs libmilter" counter null
echo
echo "- (b) has five limit rules at RCPT (rcpt_domain, sender_domain, client_ip, client_ip/24,"
echo "  sender+rcpt_domain), $RATE each; (d) also distinct recipients per sender_domain"
echo "  ($RATE) and sessions at once per client_ip (max 1000000)."
echo "- (c) counts recipients per domain in a 60 s window, in one hash table under one mutex"
echo "  (limit 1000000, so it refuses nothing)."
echo "- Medians over the rounds; threads and RSS are peaks; refused = messages not accepted,"
echo "  summed over the rounds (a refused recipient shows only when all 3 are): it should be 0."
for n in "${NAMES[@]}"; do
	[ -z "${PROTO_OF[$n]:-}" ] || echo "- ${LABEL[$n]} negotiated protocol flags ${PROTO_OF[$n]}."
done
# (a) skips CONNECT, HELO and MAIL where the others send them without a reply: compare
# the flags without SMFIP_NOCONNECT, NOHELO, NOMAIL (0x7) and SMFIP_NR_CONN, NR_HELO,
# NR_MAIL (0x7000).
seen=
for n in "${NAMES[@]}"; do
	p=${PROTO_OF[$n]:-}
	if [ -z "$p" ] || [ "$p" = mixed ]; then
		continue
	fi
	p=$(printf '0x%08x' $(( p & ~0x7007 )))
	if [ -n "$seen" ] && [ "$p" != "$seen" ]; then
		echo "- WARNING: the filters negotiated different protocol steps; their rows do not carry"
		echo "  the same traffic."
		break
	fi
	seen=$p
done
