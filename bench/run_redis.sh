#!/usr/bin/env bash
# run_redis.sh -- decisions through the Redis store against the memory store, in one run:
# milter_load against (a) one sluiced with the memory store, (b) one sluiced node with
# the Redis store alone and (c) two sluiced nodes sharing that Redis store, driven at
# once, with the same three rules; Redis on loopback TCP, on a unix socket, and a Redis
# Cluster of three masters on loopback TCP.
#
# Usage: bench/run_redis.sh [BUILD_DIR]         (default ./build)
#
# The script starts its own redis-server (no persistence: --save '' --appendonly no)
# listening on 127.0.0.1 and on a unix socket in a temporary directory, and every sluiced
# at once: the memory node, nodes A and B on TCP, nodes A and B on the unix socket, and
# (for the cluster runs) three cluster-enabled redis-servers made one cluster with
# `redis-cli --cluster create` and nodes A and B on it.  Each node has three rules, and
# milter_load sends BENCH_RCPTS (2) recipients, so that every milter session makes four
# decisions (store calls):
#     per-client-ip      stage connect, key client_ip, BENCH_CLIENT_RATE (100/1d)
#     per-sender-domain  stage mail, key sender_domain, BENCH_RCPT_RATE
#     per-rcpt-domain    stage rcpt, key rcpt_domain, count recipients, BENCH_RCPT_RATE
# milter_load gives every session a new client address, so Redis holds one key per
# client address (about 15 minutes at 100/1d: longer than the run: 100,000 and more in
# a run), and the sender's and the recipients' domains are hot keys; no rule refuses
# anything.  milter_load -c BENCH_CONCURRENCY drives one node, or both
# nodes of a pair at once with one milter_load each, for each entry of BENCH_RUNS in
# turn, BENCH_ROUNDS times (memory, tcp1, tcp2, unix1, unix2, memory, ...), so that a
# slow moment of the machine does not land on one store only; the c=1 probe runs come
# after each round's load runs.  Rows hold medians over the rounds.
#
# Decisions are counted by sluiced itself (the store's "decisions" in `sluice stats`,
# before and after each run), divided by the sessions milter_load completed in the load
# phase: decisions/s = sessions/s x decisions per session.  What Redis did comes from
# INFO commandstats and INFO cpu around each run, and the memory per key from INFO
# memory (used_memory) and DBSIZE before the first and after the last Redis run.
# See bench/README.md, "The Redis benchmark".
#
# Everything shares the machine's CPUs: the two-node runs have two sluiced, two
# milter_load and redis-server on them at once.
#
# Environment: BENCH_DURATION (seconds per run, default 10), BENCH_WARMUP (default 1),
# BENCH_CONCURRENCY (sessions per node, default 100), BENCH_ROUNDS (default 3),
# BENCH_RUNS (default "memory tcp1 tcp2 unix1 unix2 cluster1 cluster2"), BENCH_PROBE
# (the runs at concurrency 1, default "memory unix1 cluster1"; empty: none),
# BENCH_RCPTS (recipients per message, default 2), BENCH_PROBE_DURATION (default 3),
# BENCH_CLIENT_RATE (default 100/1d), BENCH_RCPT_RATE (default 1000000000/1m),
# BENCH_REDIS_TIMEOUT (the store's timeout, default 50ms), BENCH_REDIS_SERVER and
# BENCH_REDIS_CLI (default redis-server and redis-cli from PATH), BENCH_EXTRA_CONF (lines
# appended to every sluiced configuration), BENCH_KEEP=1 (keep the temporary directory:
# configurations, logs, one JSON line per run, the Redis INFO snapshots).

set -u
PROG=run_redis
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD=${1:-./build}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-1}
CONC=${BENCH_CONCURRENCY:-100}
ROUNDS=${BENCH_ROUNDS:-3}
PROBE_DURATION=${BENCH_PROBE_DURATION:-3}
CLIENT_RATE=${BENCH_CLIENT_RATE:-100/1d}
RCPT_RATE=${BENCH_RCPT_RATE:-1000000000/1m}
RCPTS=${BENCH_RCPTS:-2}
REDIS_TIMEOUT=${BENCH_REDIS_TIMEOUT:-50ms}
REDIS_SERVER=${BENCH_REDIS_SERVER:-redis-server}
REDIS_CLI=${BENCH_REDIS_CLI:-redis-cli}

LOAD=$BUILD/bench/milter_load
SLUICED=$BUILD/src/daemon/sluiced
SLUICE=$BUILD/src/cli/sluice

need_built "$LOAD" "$SLUICED" "$SLUICE"
command -v "$REDIS_SERVER" >/dev/null || die "$REDIS_SERVER not found (Debian: redis-server)"
command -v "$REDIS_CLI" >/dev/null || die "$REDIS_CLI not found (Debian: redis-tools)"
read -r -a RUNS <<<"${BENCH_RUNS:-memory tcp1 tcp2 unix1 unix2 cluster1 cluster2}"
read -r -a PROBES <<<"${BENCH_PROBE-memory unix1 cluster1}"
CLUSTER=
for run in "${RUNS[@]}" "${PROBES[@]}"; do
	case $run in
	memory|tcp1|tcp2|unix1|unix2) ;;
	cluster1|cluster2) CLUSTER=1 ;;
	*) die "BENCH_RUNS/BENCH_PROBE: unknown run $run (memory, tcp1, tcp2, unix1, unix2, cluster1, cluster2)" ;;
	esac
done
bench_tmpdir
nofile_max
LOADAVG_START=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null)

# cpu_ticks: "steal total" of the machine's CPUs so far (/proc/stat), for the caption.
cpu_ticks() {
	awk '$1 == "cpu" { print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat 2>/dev/null
}
TICKS_START=$(cpu_ticks)

# ---- redis-server ---------------------------------------------------------------------

RDIR=$DIR/redis
RSOCK=$RDIR/redis.sock
mkdir -p "$RDIR"

rcli() { "$REDIS_CLI" -s "$RSOCK" "$@"; }

# On a free loopback port: a port in use makes redis-server exit, and another is tried.
RPORT=
for _ in 1 2 3 4 5 6 7 8; do
	port=$((20000 + RANDOM % 40000))
	"$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --unixsocket "$RSOCK" \
	    --unixsocketperm 700 --save '' --appendonly no --dir "$RDIR" \
	    --logfile "$RDIR/redis.log" &
	PID[redis]=$!
	if wait_socket "$RSOCK" "${PID[redis]}"; then
		RPORT=$port
		break
	fi
	stop redis
done
if [ -z "$RPORT" ]; then
	say "redis-server did not come up; its log:"
	tail -n 20 "$RDIR/redis.log" >&2
	exit 1
fi
for _ in $(seq 1 50); do
	[ "$(rcli PING 2>/dev/null)" = PONG ] && break
	sleep 0.1
done
[ "$(rcli PING 2>/dev/null)" = PONG ] || die "redis-server does not answer PING"
REDIS_VERSION=$(rcli INFO server | sed -n 's/^redis_version:\([^[:space:]]*\).*/\1/p')

# The cluster: three masters (no replicas: every server decides), each on a free port.
CPORTS=()
if [ -n "$CLUSTER" ]; then
	for i in 1 2 3; do
		d=$DIR/cluster$i
		mkdir -p "$d"
		for _ in 1 2 3 4 5 6 7 8; do
			port=$((20000 + RANDOM % 40000))
			(cd "$d" && exec "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 \
			    --cluster-enabled yes --cluster-config-file nodes.conf \
			    --save '' --appendonly no --dir "$d" --logfile "$d/redis.log") &
			PID[cluster$i]=$!
			up=
			for _ in $(seq 1 50); do
				if [ "$("$REDIS_CLI" -p "$port" PING 2>/dev/null)" = PONG ]; then
					up=1
					break
				fi
				kill -0 "${PID[cluster$i]}" 2>/dev/null || break
				sleep 0.1
			done
			[ -n "$up" ] && { CPORTS+=("$port"); break; }
			stop "cluster$i"
		done
	done
	[ "${#CPORTS[@]}" = 3 ] || die "the cluster's redis-servers did not come up"
	"$REDIS_CLI" --cluster create "127.0.0.1:${CPORTS[0]}" "127.0.0.1:${CPORTS[1]}" \
	    "127.0.0.1:${CPORTS[2]}" --cluster-yes > "$DIR/cluster-create.log" 2>&1 ||
	    die "redis-cli --cluster create failed: $(tail -n 3 "$DIR/cluster-create.log")"
	for _ in $(seq 1 100); do
		ok=0
		for port in "${CPORTS[@]}"; do
			"$REDIS_CLI" -p "$port" CLUSTER INFO 2>/dev/null | grep -q '^cluster_state:ok' &&
			    ok=$((ok + 1))
		done
		[ "$ok" = 3 ] && break
		sleep 0.1
	done
	[ "$ok" = 3 ] || die "the cluster did not reach cluster_state:ok"
fi

# rinfo SECTION FIELD: one field of INFO SECTION.
rinfo() {
	rcli INFO "$1" | sed -n "s/^$2:\\([^[:space:]]*\\).*/\\1/p"
}

# redis_snapshot FILE RUN: "calls usec cpu_s" -- EVALSHA and EVAL calls and their time
# in Redis (commandstats), Redis's user+system CPU seconds; for a cluster run, summed over
# its three masters.
redis_snapshot() {
	local -a servers=("-s" "$RSOCK")
	case $2 in cluster*) servers=() ;; esac
	: > "$1.commandstats"
	: > "$1.cpu"
	if [ "${#servers[@]}" -gt 0 ]; then
		rcli INFO commandstats >> "$1.commandstats"
		rcli INFO cpu >> "$1.cpu"
	else
		for port in "${CPORTS[@]}"; do
			"$REDIS_CLI" -p "$port" INFO commandstats >> "$1.commandstats"
			"$REDIS_CLI" -p "$port" INFO cpu >> "$1.cpu"
		done
	fi
	awk -F '[:=,]' '
		/^cmdstat_(evalsha|eval):/ { calls += $3; usec += $5 }
		/^used_cpu_(sys|user):/ { cpu += $2 }
		END { printf "%d %d %.6f\n", calls, usec, cpu }' "$1.commandstats" "$1.cpu"
}

# ---- the sluiced nodes ----------------------------------------------------------------

declare -A STORE_OF SOCK LABEL NODES
STORE_OF[memory]=""
STORE_OF[tcpA]="store { type = \"redis\"; server = \"127.0.0.1:$RPORT\"; nodes = 2; timeout = $REDIS_TIMEOUT; }"
STORE_OF[tcpB]=${STORE_OF[tcpA]}
STORE_OF[unixA]="store { type = \"redis\"; server = \"unix:$RSOCK\"; nodes = 2; timeout = $REDIS_TIMEOUT; }"
STORE_OF[unixB]=${STORE_OF[unixA]}
if [ -n "$CLUSTER" ]; then
	STORE_OF[clusterA]="store { type = \"redis\"; cluster = [\"127.0.0.1:${CPORTS[0]}\", \"127.0.0.1:${CPORTS[1]}\"]; nodes = 2; timeout = $REDIS_TIMEOUT; }"
	STORE_OF[clusterB]=${STORE_OF[clusterA]}
fi
NODES[cluster1]=clusterA
NODES[cluster2]="clusterA clusterB"
LABEL[cluster1]="Redis Cluster, 3 masters, 1 node"
LABEL[cluster2]="Redis Cluster, 3 masters, 2 nodes"
NODES[memory]=memory
NODES[tcp1]=tcpA
NODES[tcp2]="tcpA tcpB"
NODES[unix1]=unixA
NODES[unix2]="unixA unixB"
LABEL[memory]="memory, 1 node"
LABEL[tcp1]="Redis TCP, 1 node"
LABEL[tcp2]="Redis TCP, 2 nodes"
LABEL[unix1]="Redis unix, 1 node"
LABEL[unix2]="Redis unix, 2 nodes"

# sluiced_conf NODE: node NODE's configuration on stdout.
sluiced_conf() {
	local d=$DIR/$1
	sluiced_conf_head "$d" state
	echo "milter { listen = \"unix:$d/milter.sock\"; max_sessions = 30000; }"
	[ -z "${STORE_OF[$1]}" ] || echo "${STORE_OF[$1]}"
	printf 'limit "per-client-ip" { stage = "connect"; key = "client_ip"; rate = ["%s"]; }\n' \
	    "$CLIENT_RATE"
	printf 'limit "per-sender-domain" { stage = "mail"; key = "sender_domain"; rate = ["%s"]; }\n' \
	    "$RCPT_RATE"
	printf 'limit "per-rcpt-domain" { stage = "rcpt"; key = "rcpt_domain"; count = "recipients"; rate = ["%s"]; }\n' \
	    "$RCPT_RATE"
	[ -z "${BENCH_EXTRA_CONF:-}" ] || printf '%s\n' "$BENCH_EXTRA_CONF"
}

start_node() {                  # start_node NODE
	local node=$1 d=$DIR/$1
	mkdir -p "$d"
	sluiced_conf "$node" > "$d/sluice.conf"
	if ! "$SLUICED" -t -c "$d/sluice.conf" > "$d/check.log" 2>&1; then
		say "$node: sluiced does not accept its configuration:"
		sed 's/^/    /' "$d/check.log" >&2
		exit 1
	fi
	"$SLUICED" -c "$d/sluice.conf" 2>>"$d/sluiced.log" &
	PID[$node]=$!
	SOCK[$node]=$d/milter.sock
	started "$node" "$node: sluiced" "$d/sluiced.log" "$d/milter.sock" "$d/control.sock" ||
	    exit 1
}

# stat_store NODE FILE: NODE's `sluice stats --json` to FILE; prints "decisions
# fallbacks timeouts" of its store (0 for what the memory store does not have).
stat_store() {
	"$SLUICE" -s "unix:$DIR/$1/control.sock" stats --json > "$2" 2>&1 ||
	    { say "$1: sluice stats failed: $(head -c 200 "$2")"; echo "0 0 0"; return; }
	sed 's/.*"store"://' "$2" | awk '{
		n = split("decisions fallbacks timeouts", k, " ")
		for (i = 1; i <= n; i++) {
			v = 0
			if (match($0, "\"" k[i] "\":[0-9]+")) v = substr($0, RSTART + length(k[i]) + 3, RLENGTH - length(k[i]) - 3)
			printf "%s%s", v, i < n ? " " : "\n"
		}
	}'
}

declare -A NEEDED
for run in "${RUNS[@]}" "${PROBES[@]}"; do
	for node in ${NODES[$run]}; do
		NEEDED[$node]=1
	done
done
for node in memory tcpA tcpB unixA unixB clusterA clusterB; do
	[ -z "${NEEDED[$node]:-}" ] || start_node "$node"
done
# A worker connects to Redis at its first decision: a few sessions on every Redis node
# make each worker connect and load the scripts before memory is first read.
for node in tcpA tcpB unixA unixB clusterA clusterB; do
	[ -z "${NEEDED[$node]:-}" ] && continue
	"$LOAD" -c 4 -n 40 -w 0 "unix:${SOCK[$node]}" > "$DIR/$node/first.log" 2>&1 ||
	    { say "$node: the first sessions failed:"; tail -n 5 "$DIR/$node/first.log" >&2; exit 1; }
	"$SLUICE" -s "unix:$DIR/$node/control.sock" stats > "$DIR/$node/stats0" 2>&1
	grep -q 'connected to' "$DIR/$node/stats0" ||
	    die "$node: the store is not connected: $(grep '^store' "$DIR/$node/stats0")"
done
MEM_BEFORE=$(rinfo memory used_memory)
KEYS_BEFORE=$(rcli DBSIZE)

# ---- measuring ------------------------------------------------------------------------

RECORDS=$DIR/records            # one line per node and run
RRECORDS=$DIR/redis-records     # one line per Redis run

# measure RUN CONC SECONDS ROUND: one run: milter_load at concurrency CONC against
# every node of RUN at once.
measure() {
	local run=$1 conc=$2 secs=$3 round=$4 node out t0 t1 rb ra
	local -a nodes pids
	local -A before
	read -r -a nodes <<<"${NODES[$run]}"
	for node in "${nodes[@]}"; do
		if ! kill -0 "${PID[$node]}" 2>/dev/null; then
			say "$node: sluiced died; its log:"
			tail -n 20 "$DIR/$node/sluiced.log" >&2
			exit 1
		fi
		before[$node]=$(stat_store "$node" "$DIR/$node/stats-$run-c$conc-r$round.before")
	done
	[ "$run" = memory ] || rb=$(redis_snapshot "$RDIR/$run-c$conc-r$round.before" "$run")
	say "$run: round $round of $ROUNDS, concurrency $conc per node, ${secs}s"
	t0=$(date +%s.%N)
	pids=()
	for node in "${nodes[@]}"; do
		out=$DIR/$run-c$conc-$node-r$round.json
		load_run "$node" "$out" milter_load "$LOAD" -c "$conc" -r "$RCPTS" -t "$secs" -w "$WARMUP" \
		    --json --label "$run/$node" --pid "${PID[$node]}" "unix:${SOCK[$node]}" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do
		wait "$p"
	done
	t1=$(date +%s.%N)
	local total=0
	for node in "${nodes[@]}"; do
		out=$DIR/$run-c$conc-$node-r$round.json
		local after
		after=$(stat_store "$node" "$DIR/$node/stats-$run-c$conc-r$round.after")
		if [ ! -s "$out" ]; then
			rm -f "$out"
			continue
		fi
		# shellcheck disable=SC2086 # two lists of three numbers
		set -- ${before[$node]} $after
		printf '%s %s %s %s %s %s %s %s %s %s %s %s %s %s\n' "$run" "$conc" "$round" "$node" \
		    "$(jget sessions_per_s "$out")" "$(jget p50 "$out")" "$(jget p99 "$out")" \
		    "$(jget cpu_us_per_session "$out")" "$(jget sessions_all "$out")" \
		    "$(($4 - $1))" "$(($5 - $2))" "$(($6 - $3))" \
		    "$(( $(jget messages "$out") - $(jget accept "$out") ))" "$(jget total "$out")" \
		    >> "$RECORDS"
		total=$((total + $4 - $1))
	done
	if [ "$run" != memory ]; then
		ra=$(redis_snapshot "$RDIR/$run-c$conc-r$round.after" "$run")
		# shellcheck disable=SC2086 # two lists of three numbers
		set -- $rb $ra
		echo "$run $conc $round $(($4 - $1)) $(($5 - $2)) $(awk -v a="$3" -v b="$6" \
		    'BEGIN { printf "%.6f", b - a }') $(awk -v a="$t0" -v b="$t1" \
		    'BEGIN { printf "%.3f", b - a }') $total" >> "$RRECORDS"
	fi
}

for r in $(seq 1 "$ROUNDS"); do
	for run in "${RUNS[@]}"; do
		measure "$run" "$CONC" "$DURATION" "$r"
	done
	for run in "${PROBES[@]}"; do
		measure "$run" 1 "$PROBE_DURATION" "$r"
	done
done

LOADAVG_END=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null)
# On a virtual machine, time the host gave to others: every row is slower by it.
STEAL=$(echo "$TICKS_START $(cpu_ticks)" |
    awk 'NF == 4 && $4 > $2 { printf "%.1f %%", 100 * ($3 - $1) / ($4 - $2) }')
MEM_AFTER=$(rinfo memory used_memory)
KEYS_AFTER=$(rcli DBSIZE)
SAMPLE_KEY=$(rcli --scan --pattern 'sluice:per-client-ip:*' 2>/dev/null | head -n 1)
SAMPLE_BYTES=
[ -z "$SAMPLE_KEY" ] || SAMPLE_BYTES=$(rcli MEMORY USAGE "$SAMPLE_KEY")

# ---- the tables -------------------------------------------------------------------------

[ -s "$RECORDS" ] || die "no run succeeded"

MEDIAN='function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++)
		for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

# agg RUN CONC NODE: "sessions/s decisions/s p50 p99 cpu_us/decision dec/session runs
# fallbacks timeouts refused errors": medians, and sums of the counts.
agg() {
	awk -v run="$1" -v conc="$2" -v node="$3" "$MEDIAN"'
		$1 == run && $2 == conc && $4 == node {
			n++; dps = $9 > 0 ? $10 / $9 : 0
			rate[n] = $5; drate[n] = $5 * dps; p50[n] = $6; p99[n] = $7
			cpu[n] = dps > 0 ? $8 / dps : 0; per[n] = dps
			fb += $11; to += $12; ref += $13; err += $14 }
		END { if (n) printf "%.1f %.1f %.3f %.3f %.1f %.2f %d %d %d %d %d\n", median(rate, n),
			median(drate, n), median(p50, n), median(p99, n), median(cpu, n),
			median(per, n), n, fb, to, ref, err }' "$RECORDS"
}

# ragg RUN CONC: "decisions/s over all nodes, calls/decision, Redis µs per call, Redis CPU
# µs per decision, Redis CPU busy (cores)", medians over the rounds.
ragg() {
	[ -s "$RRECORDS" ] || return
	awk -v run="$1" -v conc="$2" -v rec="$RECORDS" "$MEDIAN"'
		BEGIN {
			while ((getline l < rec) > 0) {
				split(l, f, " ")
				if (f[1] == run && f[2] == conc && f[9] > 0)
					all[f[3]] += f[5] * f[10] / f[9]
			}
		}
		$1 == run && $2 == conc && $8 > 0 {
			n++; d[n] = all[$3]; cpd[n] = $4 / $8; us[n] = $4 > 0 ? $5 / $4 : 0
			cpu[n] = $6 * 1e6 / $8; busy[n] = $7 > 0 ? $6 / $7 : 0 }
		END { if (n) printf "%.1f %.2f %.1f %.1f %.2f\n", median(d, n), median(cpd, n),
			median(us, n), median(cpu, n), median(busy, n) }' "$RRECORDS"
}

fmt_int() { awk -v x="$1" 'BEGIN { printf "%.0f", x }'; }

declare -A MEM_P50 MEM_P99 SLOWEST_DPS WORST_ADDED
ROWS=()
for conc in "$CONC" 1; do
	if [ "$conc" = "$CONC" ]; then
		list=("${RUNS[@]}")
	else
		[ "${#PROBES[@]}" -gt 0 ] || continue
		[ "$CONC" = 1 ] && continue
		list=("${PROBES[@]}")
	fi
	read -r _ _ mp50 mp99 _ <<<"$(agg memory "$conc" memory)"
	MEM_P50[$conc]=${mp50:-}
	MEM_P99[$conc]=${mp99:-}
	for run in "${list[@]}"; do
		for node in ${NODES[$run]}; do
			read -r rate drate p50 p99 cpu per runs fb to ref err <<<"$(agg "$run" "$conc" "$node")"
			if [ -z "${runs:-}" ]; then
				ROWS+=("| ${LABEL[$run]} | $conc | $node | - | - | - | - | - | - | - | - | - | - | no run |")
				continue
			fi
			added=-
			added50=-
			if [ "$run" != memory ] && [ -n "${MEM_P99[$conc]}" ]; then
				added=$(awk -v a="$p99" -v b="${MEM_P99[$conc]}" 'BEGIN { printf "%+.3f", a - b }')
				added50=$(awk -v a="$p50" -v b="${MEM_P50[$conc]}" 'BEGIN { printf "%+.3f", a - b }')
			fi
			ROWS+=("| ${LABEL[$run]} | $conc | $node | $(fmt_int "$rate") | **$(fmt_int "$drate")** | $per | $p50 | $p99 | $added50 | $added | $cpu | $runs | $fb / $to | $ref / $err |")
			if [ "$conc" = "$CONC" ] && [ "$run" != memory ]; then
				SLOWEST_DPS[$run]=$(awk -v a="${SLOWEST_DPS[$run]:-}" -v b="$drate" \
				    'BEGIN { print (a == "" || b < a) ? b : a }')
				[ "$added" = - ] ||
				    WORST_ADDED[$run]=$(awk -v a="${WORST_ADDED[$run]:-}" -v b="$added" \
				    'BEGIN { print (a == "" || b > a) ? b : a }')
			fi
		done
	done
done

RROWS=()
for conc in "$CONC" 1; do
	if [ "$conc" = "$CONC" ]; then
		list=("${RUNS[@]}")
	else
		[ "$CONC" = 1 ] && continue
		list=("${PROBES[@]}")
	fi
	for run in "${list[@]}"; do
		[ "$run" = memory ] && continue
		read -r all cpd us cpu busy <<<"$(ragg "$run" "$conc")"
		[ -n "${busy:-}" ] || continue
		RROWS+=("| ${LABEL[$run]} | $conc | $(fmt_int "$all") | $cpd | $us | $cpu | $busy |")
	done
done

echo "## Redis store benchmark"
echo
echo "$(machine) redis-server $REDIS_VERSION; milter_load at concurrency $CONC per node" \
    "(and 1 for the probe rows), ${DURATION}s per run (probe ${PROBE_DURATION}s) after" \
    "${WARMUP}s warm-up, rounds: $ROUNDS; each session: new unix-socket connection, OPTNEG," \
    "CONNECT, HELO, MAIL, $RCPTS RCPT, end-of-message, QUIT. Three rules:" \
    "per-client-ip at connect ($CLIENT_RATE), per-sender-domain at mail and" \
    "per-rcpt-domain at rcpt (count recipients) ($RCPT_RATE): $((2 + RCPTS)) decisions per" \
    "session. All of it -- the sluiced nodes, the milter_load processes and the" \
    "redis-servers -- shares these $(nproc) CPUs; the two-node runs put two sluiced, two" \
    "milter_load and Redis on them at once. Load average at the" \
    "start: ${LOADAVG_START:-?}, at the end: ${LOADAVG_END:-?}; CPU time stolen by the" \
    "hypervisor during the run: ${STEAL:-?}."
echo
echo "| store | conc | node | sessions/s | decisions/s | decisions/session | p50 ms | p99 ms | added p50 ms | added p99 ms | sluiced CPU µs/decision | runs | on_failure / timeouts | refused / errors |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
echo
if [ "${#RROWS[@]}" -gt 0 ]; then
	echo "| Redis | conc | decisions/s, all nodes | calls/decision | Redis µs/call | Redis CPU µs/decision | Redis CPU (cores) |"
	echo "|---|---:|---:|---:|---:|---:|---:|"
	printf '%s\n' "${RROWS[@]}"
	echo
fi
keys=$((KEYS_AFTER - KEYS_BEFORE))
if [ "$keys" -gt 0 ]; then
	echo "| Redis memory | value |"
	echo "|---|---:|"
	echo "| keys (DBSIZE) | $keys |"
	echo "| used_memory before / after | $MEM_BEFORE / $MEM_AFTER |"
	echo "| bytes per key ((after - before) / keys) | **$(awk -v a="$MEM_AFTER" -v b="$MEM_BEFORE" -v k="$keys" 'BEGIN { printf "%.1f", (a - b) / k }')** |"
	[ -z "$SAMPLE_BYTES" ] || echo "| MEMORY USAGE of one key ($(printf '%s' "$SAMPLE_KEY" | cut -c 1-60)) | $SAMPLE_BYTES |"
	echo
fi
echo "- decisions/s = sessions/s × decisions per session; the decisions are sluiced's own"
echo "  count of store calls (\`sluice stats\`), over the sessions of the load phase."
echo "- p50 / p99: whole milter sessions, connect to the end-of-message reply; each session"
echo "  waits for $((2 + RCPTS)) decisions in turn. added p50 / p99 = this row's − the memory store's at the"
echo "  same concurrency. At concurrency $CONC every run saturates the CPUs, so a session's"
echo "  latency is about $CONC ÷ sessions/s: the added p99 there follows the lost"
echo "  throughput. The probe rows (concurrency 1) show what the round trips add: $((2 + RCPTS)) per"
echo "  session."
echo "- on_failure / timeouts: decisions that Redis did not answer within $REDIS_TIMEOUT and"
echo "  that this node's local share decided; they should be 0."
echo "- Redis µs/call: time inside EVALSHA (INFO commandstats); Redis CPU: redis-server's"
echo "  user+system time over the run (INFO cpu), summed over the masters of the cluster;"
echo "  one Redis server serves every node with one thread. calls/decision below 1: the"
echo "  decisions of one loop pass went as one script call."
read -r MEM_RATE _ <<<"$(agg memory "$CONC" memory)"
verdict() { awk -v a="$1" -v b="$2" -v op="$3" 'BEGIN { ok = op == ">=" ? a >= b : a <= b; print ok ? "met" : "not met" }'; }
for run in tcp1 unix1 cluster1 tcp2 unix2 cluster2; do
	[ -n "${SLOWEST_DPS[$run]:-}" ] || continue
	read -r rate _ <<<"$(agg "$run" "$CONC" "${NODES[$run]%% *}")"
	read -r _ _ _ rcpu _ <<<"$(ragg "$run" "$CONC")"
	line="- targets, ${LABEL[$run]}: ≥ 50,000 decisions/s per node:"
	line="$line $(verdict "${SLOWEST_DPS[$run]}" 50000 ">=") ($(fmt_int "${SLOWEST_DPS[$run]}") on the slowest node)"
	case $run in *1)
		[ -n "${MEM_RATE:-}" ] && [ -n "${rate:-}" ] &&
		    line="$line; ≥ 0.8× the memory store's sessions/s: $(verdict "$(awk -v a="$rate" -v b="$MEM_RATE" 'BEGIN { printf "%.2f", a / b }')" 0.8 ">=") ($(awk -v a="$rate" -v b="$MEM_RATE" 'BEGIN { printf "%.2f", a / b }')×)" ;;
	esac
	[ -n "${rcpu:-}" ] && line="$line; ≤ 8 µs of Redis CPU per decision: $(verdict "$rcpu" 8 "<=") ($rcpu µs)"
	echo "$line."
done
for run in "${PROBES[@]}"; do
	[ "$run" = memory ] && continue
	[ "$CONC" = 1 ] && continue
	read -r _ _ _ p99 _ <<<"$(agg "$run" 1 "${NODES[$run]%% *}")"
	[ -n "${p99:-}" ] && [ -n "${MEM_P99[1]:-}" ] || continue
	added=$(awk -v a="$p99" -v b="${MEM_P99[1]}" 'BEGIN { printf "%+.3f", a - b }')
	echo "- target, ${LABEL[$run]}, one session at a time: ≤ 0.5 ms added to a session's" \
	    "p99 ($((2 + RCPTS)) decisions): $(verdict "$added" 0.5 "<=") ($added ms)."
done
