#!/bin/sh
# idle_ab.sh -- does holding many idle connections slow a filter down?
#
# Usage: bench/idle_ab.sh [BUILD_DIR] [ROUNDS]
#
# One filter instance, measured alternately without and with IDLE idle connections
# (negotiated, CONNECT sent, then silent) at concurrency LOAD, ROUNDS times each, and the
# means compared.  Alternating on one instance cancels most of the drift of a noisy
# machine that separate runs suffer from.  Runs sluiced, and the libmilter null filter
# when it was built.
set -eu
BUILD=${1:-./build}
ROUNDS=${2:-4}
IDLE=${BENCH_IDLE:-10000}
LOAD=${BENCH_IDLE_LOAD:-100}
SECS=${BENCH_DURATION:-4}
LOADGEN=$BUILD/bench/milter_load
SLUICED=$BUILD/src/daemon/sluiced
NULL_MILTER=$BUILD/bench/null_milter
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
DIR=$(mktemp -d "${TMPDIR:-/tmp}/sluice-idle.XXXXXX")
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM

rate() {
	"$LOADGEN" -c "$LOAD" -t "$SECS" "$@" "$SOCK" | awk '$1 == "rate" { print $2 }'
}

measure() {
	name=$1
	sum_a=0; sum_b=0
	for i in $(seq "$ROUNDS"); do
		a=$(rate); b=$(rate -i "$IDLE")
		echo "  $name round $i: without idle $a/s, with $IDLE idle $b/s" >&2
		sum_a=$(awk "BEGIN { print $sum_a + $a }"); sum_b=$(awk "BEGIN { print $sum_b + $b }")
	done
	echo "$name $sum_a $sum_b $ROUNDS" | awk '{ a = $2 / $4; b = $3 / $4;
		printf "| %s | %.0f | %.0f | %+.1f%% |\n", $1, a, b, (b - a) * 100 / a }'
}

echo "| server | sessions/s without idle | with $IDLE idle | change |"
echo "|---|---:|---:|---:|"
{ [ "$(id -u)" != 0 ] || echo 'user = "root";'; } > "$DIR/s.conf"
cat >> "$DIR/s.conf" <<CONF
workers = 2;
stats_interval = 0;
state_dir = "$DIR/state";
log { target = "stderr"; level = "warning"; }
milter { listen = "unix:$DIR/milter.sock"; max_sessions = 30000;
  reply { connect = "continue"; helo = "continue"; mail = "continue"; rcpt = "continue"; eom = "accept"; } }
CONF
SOCK=unix:$DIR/milter.sock
"$SLUICED" -c "$DIR/s.conf" 2>"$DIR/sluiced.log" & PID=$!
sleep 0.5
measure sluiced
kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
if [ -x "$NULL_MILTER" ]; then
	SOCK=unix:$DIR/null.sock
	"$NULL_MILTER" -p "$SOCK" 2>"$DIR/null.log" & PID=$!
	sleep 0.5
	measure libmilter
fi
