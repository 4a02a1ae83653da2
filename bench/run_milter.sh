#!/usr/bin/env bash
# run_milter.sh -- the milter benchmark: sluiced against a libmilter null filter.
#
# Usage: bench/run_milter.sh [BUILD_DIR]        (default ./build; `make bench` uses build)
#
# Both filters run side by side on unix sockets in a temporary directory and negotiate
# the same protocol steps (connect, helo, mail, rcpt and end-of-message, each with a
# reply; everything else skipped).  For each point -- concurrency 1, 100 and 1,000, then
# 10,000 idle connections held open plus load at concurrency 100 -- milter_load drives
# one filter at a time and reads the filter's /proc entries (--pid).  The result is a
# markdown table on stdout; progress and problems go to stderr.  See bench/README.md.
#
# Environment: BENCH_DURATION (seconds measured per point, default 5), BENCH_WARMUP
# (default 1), BENCH_CONCURRENCY (default "1 100 1000"), BENCH_IDLE (default 10000),
# BENCH_IDLE_LOAD (concurrency beside the idle connections, default 100),
# BENCH_KEEP=1 keeps the temporary directory (configs, logs, JSON lines).

set -u
PROG=run_milter
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD=${1:-./build}
DURATION=${BENCH_DURATION:-5}
WARMUP=${BENCH_WARMUP:-1}
CONCURRENCY=${BENCH_CONCURRENCY:-"1 100 1000"}
IDLE=${BENCH_IDLE:-10000}
IDLE_LOAD=${BENCH_IDLE_LOAD:-100}

LOAD=$BUILD/bench/milter_load
NULL_MILTER=$BUILD/bench/null_milter
SLUICED=$BUILD/src/daemon/sluiced

need_built "$LOAD"
bench_tmpdir
declare -A SOCK NOTE

# Every idle connection costs a descriptor in milter_load and one in the filter;
# sluiced also wants max_sessions (30000) + 64 so as not to warn.  Raising the hard
# limit needs root (CAP_SYS_RESOURCE); without it we make do with what there is.
need=$((IDLE + IDLE_LOAD + 2048))
for c in $CONCURRENCY; do
	[ $((c + 2048)) -le "$need" ] || need=$((c + 2048))
done
want=65536
[ "$want" -ge "$need" ] || want=$need
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$want" ]; then
	ulimit -Hn "$want" 2>/dev/null || ulimit -Hn "$need" 2>/dev/null ||
	    [ "$(ulimit -Hn)" -ge "$need" ] ||
	    say "cannot raise the hard open files limit to $need"
fi
nofile_max
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	say "open files limit $(ulimit -n) < $need: lowering BENCH_IDLE"
	IDLE=$(( $(ulimit -n) - 2048 - IDLE_LOAD ))
	[ "$IDLE" -gt 0 ] || IDLE=0
fi

# ---- the filters ----------------------------------------------------------------------

NAMES=()

start_sluiced() {
	local conf=$DIR/sluice.conf log=$DIR/sluiced.log
	rm -f "$DIR/milter.sock" "$DIR/control.sock"
	{
		sluiced_conf_head "$DIR"
		cat <<EOF
milter {
  listen = "unix:$DIR/milter.sock";
  max_sessions = 30000;
  reply { connect = "continue"; helo = "continue"; mail = "continue"; rcpt = "continue"; eom = "accept"; }
}
EOF
	} > "$conf"
	"$SLUICED" -c "$conf" 2>>"$log" &
	PID[sluiced]=$!
	SOCK[sluiced]=$DIR/milter.sock
	started sluiced sluiced "$log" "$DIR/milter.sock"
}

start_libmilter() {
	rm -f "$DIR/null.sock"
	# The stages sluiced negotiates with the reply block above.
	"$NULL_MILTER" -p "unix:$DIR/null.sock" -s connect,helo,mail,rcpt,eom \
	    2>>"$DIR/null_milter.log" &
	PID[libmilter]=$!
	SOCK[libmilter]=$DIR/null.sock
	started libmilter null_milter "$DIR/null_milter.log" "$DIR/null.sock"
}

start() {                       # start NAME
	case $1 in
	sluiced) start_sluiced ;;
	libmilter) start_libmilter ;;
	esac
}

if [ -x "$SLUICED" ]; then
	NAMES+=(sluiced)
else
	NOTE[sluiced]="not built ($SLUICED missing)"
fi
if [ -x "$NULL_MILTER" ]; then
	NAMES+=(libmilter)
else
	NOTE[libmilter]="not built (libmilter-dev missing when $BUILD was configured)"
fi
[ "${#NAMES[@]}" -gt 0 ] || die "neither sluiced nor null_milter is built in $BUILD"

for n in "${NAMES[@]}"; do
	start "$n" || NOTE[$n]="failed to start (see above)"
done

# ---- measuring ------------------------------------------------------------------------

ROWS=()
declare -A PROTO

# measure NAME CONCURRENCY IDLE [ROW]: one run; appends a table row unless ROW is "no".
# Sets LAST_RSS_KB to the filter's peak RSS during the run.
measure() {
	local name=$1 conc=$2 idle=$3 row=${4:-yes}
	local pid=${PID[$name]:-} out=$DIR/$name-c$2-i$3.json
	LAST_RSS_KB=
	if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
		[ "$row" = no ] || ROWS+=("| $name | $conc | $idle | - | - | - | - | - | - | - | ${NOTE[$name]:-not running} |")
		return 1
	fi
	say "$name: concurrency $conc, idle $idle, ${DURATION}s"
	if ! load_run "$name" "$out" milter_load "$LOAD" -c "$conc" -i "$idle" -t "$DURATION" \
	    -w "$WARMUP" --json --label "$name" --pid "$pid" "unix:${SOCK[$name]}"; then
		[ "$row" = no ] || ROWS+=("| $name | $conc | $idle | - | - | - | - | - | - | - | milter_load failed: $LOAD_FAILED |")
		return 1
	fi

	local rate p50 p99 threads rss cpu errs held lost proto
	rate=$(jget sessions_per_s "$out")
	p50=$(jget p50 "$out")
	p99=$(jget p99 "$out")
	threads=$(jget threads_max "$out")
	rss=$(jget rss_kb_max "$out")
	cpu=$(jget cpu_us_per_session "$out")
	errs=$(jget total "$out")
	held=$(jget idle_held "$out")
	lost=$(jget idle_lost "$out")
	proto=$(jget protocol "$out")
	PROTO[$name]=$(printf '0x%08x' "$proto")
	LAST_RSS_KB=$rss
	[ "$row" = no ] && return 0

	local note="" per_idle="-"
	if [ "$idle" -gt 0 ]; then
		[ "$held" = "$idle" ] || note="only $held of $idle idle held; "
		[ "$lost" = 0 ] || note="$note$lost idle lost; "
		if [ -n "${BASE_RSS_KB:-}" ] && [ "$held" -gt 0 ]; then
			per_idle=$(awk -v w="$rss" -v wo="$BASE_RSS_KB" -v n="$held" \
			    'BEGIN { printf "%.2f", (w - wo) / n }')
		fi
	fi
	[ "$(jget connect_retries "$out")" = 0 ] ||
	    note="$note$(jget connect_retries "$out") connect retries (backlog full); "
	ROWS+=("$(printf '| %s | %s | %s | %.0f | %.3f | %.3f | %s | %.1f | %.0f | %s | %s%s |' \
	    "$name" "$conc" "$idle" "$rate" "$p50" "$p99" "$threads" \
	    "$(awk -v k="$rss" 'BEGIN { print k / 1024 }')" "$cpu" "$per_idle" "$errs" \
	    "${note:+ ($note)}")")
}

for conc in $CONCURRENCY; do
	for n in "${NAMES[@]}"; do
		measure "$n" "$conc" 0
	done
done

# Idle connections: restart each filter so that earlier peaks do not hide the cost,
# warm it with the same load and no idle connections (baseline RSS), then hold $IDLE
# connections open beside that load.  RSS per idle connection = (peak RSS with them -
# peak RSS without) / idle connections held.
if [ "$IDLE" -gt 0 ]; then
	for n in "${NAMES[@]}"; do
		[ -n "${PID[$n]:-}" ] || { measure "$n" "$IDLE_LOAD" "$IDLE"; continue; }
		stop "$n"
		if ! start "$n"; then
			NOTE[$n]="failed to restart"
			measure "$n" "$IDLE_LOAD" "$IDLE"
			continue
		fi
		BASE_RSS_KB=
		measure "$n" "$IDLE_LOAD" 0 no && BASE_RSS_KB=$LAST_RSS_KB
		measure "$n" "$IDLE_LOAD" "$IDLE"
	done
fi

# ---- the table ----------------------------------------------------------------------------

echo "## milter benchmark"
echo
echo "$(machine)" \
    "${DURATION}s per point after ${WARMUP}s warm-up; each session: new unix-socket" \
    "connection, OPTNEG, CONNECT, HELO, MAIL, 3 RCPT, end-of-message, QUIT."
echo
echo "| server | concurrency | idle | sessions/s | p50 ms | p99 ms | threads | RSS MiB | CPU µs/session | RSS KiB/idle conn | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
printf '%s\n' "${ROWS[@]}"
echo
for n in sluiced libmilter; do
	if [ -n "${PROTO[$n]:-}" ]; then
		echo "- $n negotiated protocol flags ${PROTO[$n]}."
	elif [ -n "${NOTE[$n]:-}" ]; then
		echo "- $n: ${NOTE[$n]}."
	fi
done
if [ -n "${PROTO[sluiced]:-}" ] && [ -n "${PROTO[libmilter]:-}" ] &&
    [ "${PROTO[sluiced]}" != "${PROTO[libmilter]}" ]; then
	echo "- WARNING: the two filters negotiated different protocol steps; the rows are not comparable."
fi
echo "- threads and RSS are peaks sampled every 100 ms during the load phase; CPU is the"
echo "  filter's utime+stime over the load phase divided by the sessions completed in it."
