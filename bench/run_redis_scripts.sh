#!/usr/bin/env bash
# run_redis_scripts.sh -- what gcra.lua costs inside Redis, and EVALSHA against Redis 7
# Functions (FUNCTION LOAD / FCALL) for the same code, side by side in one run.
#
# Usage: bench/run_redis_scripts.sh [BUILD_DIR]        (default ./build)
#
# The script starts its own redis-server on a unix socket, loads BUILD's assembled
# src/store/redis/gcra.lua with SCRIPT LOAD and, wrapped in a library, with FUNCTION
# LOAD, and drives each with redis-benchmark (4 clients, pipelines of 20) at 1, 10 and 20
# decisions per call (one item of one window each, over 100,000 random keys: most calls
# charge and write), alternating EVALSHA and FCALL, BENCH_ROUNDS times.  It reports the
# time inside the command (INFO commandstats, usec_per_call) and redis-server's CPU
# (INFO cpu) per decision: medians over the rounds.  sluiced uses EVALSHA; see
# bench/README.md, "The Redis scripts".
#
# Environment: BENCH_ROUNDS (default 3), BENCH_CALLS (calls per run, default 50000),
# BENCH_REDIS_SERVER, BENCH_REDIS_CLI, BENCH_REDIS_BENCHMARK (default from PATH).

set -u
PROG=run_redis_scripts
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD=${1:-./build}
ROUNDS=${BENCH_ROUNDS:-3}
CALLS=${BENCH_CALLS:-50000}
REDIS_SERVER=${BENCH_REDIS_SERVER:-redis-server}
REDIS_CLI=${BENCH_REDIS_CLI:-redis-cli}
REDIS_BENCHMARK=${BENCH_REDIS_BENCHMARK:-redis-benchmark}
SCRIPT=$BUILD/src/store/redis/gcra.lua

[ -s "$SCRIPT" ] || die "$SCRIPT not built (ninja -C $BUILD)"
for p in "$REDIS_SERVER" "$REDIS_CLI" "$REDIS_BENCHMARK"; do
	command -v "$p" >/dev/null || die "$p not found (Debian: redis-server, redis-tools)"
done
bench_tmpdir
SOCK=$DIR/redis.sock
"$REDIS_SERVER" --port 0 --unixsocket "$SOCK" --unixsocketperm 700 --save '' \
    --appendonly no --dir "$DIR" --logfile "$DIR/redis.log" &
PID[redis]=$!
wait_socket "$SOCK" "${PID[redis]}" || die "redis-server did not come up"
rcli() { "$REDIS_CLI" -s "$SOCK" "$@"; }
for _ in $(seq 1 50); do
	[ "$(rcli PING 2>/dev/null)" = PONG ] && break
	sleep 0.1
done
SHA=$(rcli -x SCRIPT LOAD < "$SCRIPT") || die "SCRIPT LOAD failed"
{
	printf '#!lua name=sluice_bench\nredis.register_function("gcra", function(KEYS, ARGV)\n'
	cat "$SCRIPT"
	printf '\nend)\n'
} > "$DIR/library.lua"
rcli -x FUNCTION LOAD REPLACE < "$DIR/library.lua" >/dev/null || die "FUNCTION LOAD failed"
VERSION=$(rcli INFO server | sed -n 's/^redis_version:\([^[:space:]]*\).*/\1/p')

cpu() { rcli INFO cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'; }

# run KIND D: one run of CALLS calls of D decisions; prints "usec_per_decision cpu_us_per_decision"
run() {
	local kind=$1 d=$2 keys=() args=() i
	for i in $(seq 1 "$d"); do
		keys+=("k$i:__rand_int__")
		args+=(check 1 1 1 1 600000000 10)
	done
	local -a head
	if [ "$kind" = evalsha ]; then head=(EVALSHA "$SHA"); else head=(FCALL gcra); fi
	rcli CONFIG RESETSTAT >/dev/null
	local c0 c1
	c0=$(cpu)
	"$REDIS_BENCHMARK" -s "$SOCK" -n "$CALLS" -P 20 -c 4 -r 100000 -q \
	    "${head[@]}" "$d" "${keys[@]}" "" "$d" "${args[@]}" > /dev/null 2>&1
	c1=$(cpu)
	rcli INFO commandstats | awk -F '[:=,]' -v d="$d" -v calls="$CALLS" -v c0="$c0" -v c1="$c1" \
	    '/^cmdstat_(evalsha|fcall):/ { printf "%.2f %.2f\n", $7 / d, (c1 - c0) * 1e6 / calls / d }'
}

REC=$DIR/records
for r in $(seq 1 "$ROUNDS"); do
	for d in 1 10 20; do
		for kind in evalsha fcall; do
			say "round $r: $kind, $d decisions per call"
			echo "$kind $d $(run "$kind" "$d")" >> "$REC"
		done
	done
done

MEDIAN='function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++)
		for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'
echo "## gcra.lua inside Redis: EVALSHA and FCALL"
echo
echo "$(machine) redis-server $VERSION; redis-benchmark, 4 clients, pipelines of 20, $CALLS" \
    "calls per run, $ROUNDS rounds (medians); each decision: one item, one window, a random" \
    "key of 100,000."
echo
echo "| decisions per call | EVALSHA µs/decision in the command | FCALL µs/decision in the command | EVALSHA Redis CPU µs/decision | FCALL Redis CPU µs/decision |"
echo "|---:|---:|---:|---:|---:|"
for d in 1 10 20; do
	awk -v d="$d" "$MEDIAN"'
		$2 == d && $1 == "evalsha" { ne++; eu[ne] = $3; ec[ne] = $4 }
		$2 == d && $1 == "fcall" { nf++; fu[nf] = $3; fc[nf] = $4 }
		END { printf "| %d | %.2f | %.2f | %.2f | %.2f |\n", d, median(eu, ne), median(fu, nf),
			median(ec, ne), median(fc, nf) }' "$REC"
done
