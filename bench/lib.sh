# shellcheck shell=bash
# lib.sh -- the shell functions the benchmark scripts share (run_milter.sh, run_rules.sh,
# run_policy.sh); sourced, never run.
#
# The script sets PROG, its name for messages, before it sources this file.  It keeps the
# servers a script starts in the associative array PID (name -> pid; empty
# once stopped), so that the EXIT trap set by bench_tmpdir stops every one of them, and
# the run's files in DIR.  Messages go to stderr prefixed with the script's name; the
# scripts' results alone go to stdout.

declare -A PID

say() { printf '%s\n' "$PROG: $*" >&2; }
die() { say "$*"; exit 1; }

need_built() {                  # need_built FILE...: dies unless each is built
	local f
	for f in "$@"; do
		[ -x "$f" ] || die "$f not found: build first (meson setup $BUILD && ninja -C $BUILD)"
	done
}

# bench_tmpdir: makes DIR, removed on exit (kept with BENCH_KEEP=1) once the servers
# are stopped.
bench_tmpdir() {
	DIR=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench.XXXXXX") || die "mktemp failed"
	trap bench_cleanup EXIT
	trap 'exit 130' INT TERM
}

bench_cleanup() {
	local name
	for name in "${!PID[@]}"; do
		stop "$name"
	done
	if [ "${BENCH_KEEP:-0}" = 1 ]; then
		say "kept $DIR"
	else
		rm -rf "$DIR"
	fi
}

nofile_max() {                  # the soft open files limit up to the hard one
	ulimit -n "$(ulimit -Hn)" 2>/dev/null
}

wait_socket() {                 # wait_socket PATH PID: the server is listening
	for _ in $(seq 1 100); do
		[ -S "$1" ] && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# started NAME TEXT LOG SOCKET...: waits for server NAME (PID[NAME]) to listen on every
# SOCKET; if it does not, says "TEXT did not come up", shows the end of LOG and stops it.
started() {
	local name=$1 text=$2 log=$3 sock
	shift 3
	for sock in "$@"; do
		wait_socket "$sock" "${PID[$name]}" && continue
		say "$text did not come up; its log:"
		tail -n 20 "$log" >&2
		stop "$name"
		return 1
	done
}

stop() {                        # stop NAME; libmilter waits for open sessions on SIGTERM:
	local pid=${PID[$1]:-}      # give up after 5 seconds
	[ -n "$pid" ] || return 0
	kill "$pid" 2>/dev/null
	for _ in $(seq 1 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	PID[$1]=
}

# sluiced_conf_head D: the settings every benchmark sluiced has, its control socket and
# its state_dir in D (never the machine's /var/lib/sluice), and user = "root" when run as
# root.  (A second argument is accepted and ignored: D is new for every run, so there is
# no snapshot from an earlier one either way.)
sluiced_conf_head() {
	# as root, sluiced wants to be told to stay root
	[ "$(id -u)" != 0 ] || echo 'user = "root";'
	cat <<EOF
workers = 2;
stats_interval = 0;
EOF
	echo "state_dir = \"$1/state\";"
	cat <<EOF
log { target = "stderr"; level = "warning"; }
control { listen = "unix:$1/control.sock"; }
EOF
}

# rules_conf RATE: the five limit rules of the rule benchmarks, all decided at RCPT, each
# at RATE.
rules_conf() {
	local rule name key
	for rule in per-rcpt-domain:rcpt_domain per-sender-domain:sender_domain \
	    per-client-ip:client_ip per-client-net:client_ip/24 \
	    per-sender-rcpt-domain:sender+rcpt_domain; do
		name=${rule%%:*}
		key=${rule#*:}
		printf 'limit "%s" { stage = "rcpt"; key = "%s"; count = "messages"; rate = ["%s"]; }\n' \
		    "$name" "$key" "$1"
	done
}

# rules7_conf RATE: the two more rules of filter (d): distinct recipients per sender
# domain at RATE, and sessions at once per client address (a cap no session reaches),
# both at RCPT so that they cost no round trip the five do not.
rules7_conf() {
	printf 'limit "distinct-rcpts" { stage = "rcpt"; key = "sender_domain"; count = "distinct"; of = "rcpt"; rate = ["%s"]; }\n' "$1"
	printf 'limit "client-sessions" { stage = "rcpt"; key = "client_ip"; count = "sessions"; max = 1000000; }\n'
}

# load_run NAME OUT WHAT COMMAND...: one run of a load generator (WHAT, for messages),
# its JSON line to OUT and its stderr to OUT.err.  Returns 0 if it printed its line
# (protocol errors are shown, not fatal); else shows why, sets LOAD_FAILED to its last
# message and returns 1.
load_run() {
	local name=$1 out=$2 what=$3 rc
	shift 3
	"$@" > "$out" 2>"$out.err"
	rc=$?
	if [ "$rc" -ge 2 ] || [ ! -s "$out" ]; then
		say "$name: $what failed (exit $rc):"
		tail -n 5 "$out.err" >&2
		# shellcheck disable=SC2034 # the caller's to read
		LOAD_FAILED=$(tail -n 1 "$out.err" | cut -c 1-80)
		return 1
	fi
	[ "$rc" -eq 0 ] || { say "$name: protocol errors:"; head -n 5 "$out.err" >&2; }
	return 0
}

jget() {                        # jget KEY FILE: the scalar named KEY in a JSON line (unique keys)
	sed -n "s/.*\"$1\":\\([^,}]*\\).*/\\1/p" "$2" | head -n 1
}

machine() {                     # when and where: the start of a table's caption
	printf '%s, %s, %s CPUs;' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -sr)" "$(nproc)"
}
