#!/usr/bin/env bash
# The .deb and its hardened systemd unit, for real: builds the package with `cargo deb`
# (installs cargo-deb from crates.io when missing), installs it with `dpkg -i`, and
# checks that
#   - the package holds the binary, the unit and /etc/default/aep-relay (a conffile, 0600),
#     and a man page per command;
#   - `systemd-analyze verify` accepts the installed unit with no word of complaint, and
#     `systemd-analyze security --offline` rates its exposure 2.0 or lower;
#   - every variable the environment file names is one the binary reads;
#   - the installed binary starts from the unit's ExecStart line with the unit's
#     EnvironmentFile, answers /healthz, keeps a POSTed Event in the history directory the
#     file names, and on SIGTERM ends an open stream with `: shutting-down` and exits 0
#     within the unit's TimeoutStopSec.
# The package is purged afterwards, also on failure. CI is a container without a running
# systemd: `systemd-analyze verify` works offline, and the service is not started by
# systemd but by this script (see "Start" below). Needs root (dpkg), or sudo -n.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:${CARGO_HOME:-${HOME:-/root}/.cargo}/bin:/usr/sbin:/sbin"

sudo=""
if [[ "$(id -u)" -ne 0 ]]; then
  sudo -n true 2>/dev/null || { echo "deb: needs root or sudo -n (dpkg -i)" >&2; exit 1; }
  sudo="sudo -n"
fi
apt_install() {
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" </dev/null \
    || { $sudo apt-get update -q </dev/null \
      && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" </dev/null; }
}

if ! cargo deb --version >/dev/null 2>&1; then
  echo "deb: installing cargo-deb (crates.io)"
  cargo install cargo-deb --locked
fi
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "deb: installing systemd (Debian) for systemd-analyze"
  apt_install systemd
fi
for tool in curl dpkg dpkg-deb dpkg-query; do
  command -v "$tool" >/dev/null 2>&1 || { echo "deb: $tool is required" >&2; exit 1; }
done
echo "deb: $(cargo deb --version), $(systemd-analyze --version | head -n 1)"

pkg=aep-relay
scratch="$(mktemp -d)"
log="$scratch/relay.stderr"
pid=""
stream_pid=""
installed=""
cleanup() {
  local p
  for p in "$pid" "$stream_pid"; do
    if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  if [[ -n "$installed" ]]; then
    # Purge: `dpkg -r` and the conffile too, so the machine is as it was.
    $sudo dpkg --purge "$pkg" </dev/null >"$scratch/purge.out" 2>&1 \
      || { echo "deb: dpkg --purge $pkg failed:" >&2; cat "$scratch/purge.out" >&2; }
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

fail() {
  echo "deb: $*" >&2
  if [[ -s "$log" ]]; then
    echo "deb: the relay's stderr:" >&2
    cat "$log" >&2
  fi
  exit 1
}

# Build. cargo-deb builds `--release --bin aep-relay` with the default features, which is
# what .ci/run-smoke.sh's `cargo run --release` built earlier in .ci/run, so this reuses
# it; --fast compresses lightly (the -dbgsym .ddeb holds the 50 MB of line tables).
cargo deb --fast -- --locked >"$scratch/build.out" 2>&1 || {
  cat "$scratch/build.out" >&2
  fail "cargo deb failed"
}
deb="$(grep -E '/'"$pkg"'_[^/]*\.deb$' "$scratch/build.out" | tail -n 1)"
[[ -f "$deb" ]] || { cat "$scratch/build.out" >&2; fail "cargo deb named no .deb"; }
echo "deb: built $deb ($(du -k "$deb" | cut -f 1) KB)"

if dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q ' installed$'; then
  echo "deb: note: $pkg was installed before this run; it is replaced, and purged at the end"
fi
installed=yes
$sudo dpkg -i "$deb" </dev/null >"$scratch/install.out" 2>&1 || {
  cat "$scratch/install.out" >&2
  fail "dpkg -i $deb failed"
}
echo "deb: dpkg -i: $(dpkg-query -W -f='${Package} ${Version} ${Status}' "$pkg")"

unit=/usr/lib/systemd/system/$pkg.service
bin=/usr/bin/$pkg
for f in "$bin" "$unit" /etc/default/$pkg; do
  dpkg-query -L "$pkg" | grep -qxF "$f" || fail "the package does not list $f"
  [[ -e "$f" ]] || fail "$f is not installed"
done
[[ -x "$bin" ]] || fail "$bin is not executable"
mode="$(stat -c %a /etc/default/$pkg)"
[[ "$mode" == 600 ]] || fail "/etc/default/$pkg has mode $mode (want 600: it may hold a token)"
dpkg-query -W -f='${Conffiles}\n' "$pkg" | grep -q "^ /etc/default/$pkg " ||
  fail "/etc/default/$pkg is not a conffile (an upgrade would overwrite the operator's edits)"
echo "deb: installed $bin, $unit, /etc/default/$pkg (conffile, mode 600)"

# The man pages (contrib/man/, generated from the clap definitions), gzipped by cargo-deb:
# one per command, and `man` renders the relay's without a warning.
for page in aep-relay aep-relay-tail aep-relay-top aep-relay-validate aep-relay-check; do
  dpkg-query -L "$pkg" | grep -qE "^/usr/share/man/man1/$page\.1(\.gz)?$" ||
    fail "the package does not list the man page $page.1"
done
# Rendered from the package's own copy (a container's dpkg may exclude /usr/share/man).
dpkg-deb -x "$deb" "$scratch/pkg"
man_page="$(ls "$scratch"/pkg/usr/share/man/man1/aep-relay.1* | head -n 1)"
if command -v man >/dev/null 2>&1; then
  MANWIDTH=80 man --warnings -l "$man_page" >"$scratch/man.out" 2>"$scratch/man.err" ||
    { cat "$scratch/man.err" >&2; fail "man -l $man_page failed"; }
  [[ ! -s "$scratch/man.err" ]] || { cat "$scratch/man.err" >&2; fail "man -l $man_page warned"; }
  grep -q -- '--listen' "$scratch/man.out" || fail "man aep-relay does not show --listen"
  echo "deb: man pages installed; man aep-relay renders ($(wc -l <"$scratch/man.out") lines)"
else
  echo "deb: man pages installed ($man_page; no man command here to render it)"
fi

# systemd-analyze verify: exit status 0 and no output at all (an unknown key or a bad
# value is only a warning on stderr, with status 0).
if ! systemd-analyze verify --man=no "$unit" >"$scratch/verify.out" 2>&1 || [[ -s "$scratch/verify.out" ]]; then
  cat "$scratch/verify.out" >&2
  fail "systemd-analyze verify $unit complained"
fi
echo "deb: systemd-analyze verify $unit: ok"
# The exposure score (0 to 10; --threshold is in tenths): the hardening stays in place.
if ! systemd-analyze security --offline=true --threshold=20 "$unit" >"$scratch/security.out" 2>&1; then
  cat "$scratch/security.out" >&2
  fail "systemd-analyze security rates $unit above 2.0"
fi
echo "deb: systemd-analyze security: $(grep -o 'Overall exposure level.*' "$scratch/security.out")"

# The unit's [Service] settings this script acts on (the last assignment wins, as in
# systemd; none of these is reset by an empty assignment in this unit).
service_value() {
  awk -v key="$1" '
    /^\[/ { in_service = ($0 == "[Service]") }
    in_service && index($0, key "=") == 1 { value = substr($0, length(key) + 2) }
    END { print value }' "$unit"
}
exec_start="$(service_value ExecStart)"
env_file="$(service_value EnvironmentFile)"
state_dir="$(service_value StateDirectory)"
stop_timeout="$(service_value TimeoutStopSec)"
[[ -n "$exec_start" ]] || fail "the unit has no ExecStart"
[[ -n "$env_file" ]] || fail "the unit has no EnvironmentFile"
[[ -n "$state_dir" ]] || fail "the unit has no StateDirectory"
[[ "$stop_timeout" =~ ^[0-9]+$ ]] || fail "TimeoutStopSec is not whole seconds: $stop_timeout"
grep -q '^Environment=' "$unit" && fail "the unit sets Environment=, which this script does not emulate"
# This script runs the command line as written: no prefixes (-@:+!), specifiers (%) or
# variables ($), which systemd would expand.
[[ "$exec_start" =~ ^/ && "$exec_start" != *[%\$]* ]] ||
  fail "ExecStart is not a plain command line: $exec_start"
env_file="${env_file#-}"
[[ "$env_file" == "/etc/default/$pkg" ]] || fail "EnvironmentFile is $env_file, not the packaged file"
read -r -a command <<<"$exec_start"
[[ "${command[0]}" == "$bin" ]] || fail "ExecStart runs ${command[0]}, not $bin"
echo "deb: unit: ExecStart=$exec_start EnvironmentFile=$env_file StateDirectory=$state_dir TimeoutStopSec=$stop_timeout"

# The environment file: comments, blank lines and VARIABLE=value lines only (plain values:
# this script does not emulate systemd's quoting), and every variable it names, set or
# commented out, is one `aep-relay --help` lists.
env -i "$bin" --help >"$scratch/help.out"
assignments=()
plain_assignment='^[A-Za-z_][A-Za-z0-9_]*=[^"'"'"'\\]*$'
while IFS= read -r line || [[ -n "$line" ]]; do
  if [[ -z "${line//[[:space:]]/}" || "$line" == [#\;]* ]]; then
    continue
  fi
  [[ "$line" =~ $plain_assignment ]] ||
    fail "$env_file: not a plain VARIABLE=value line: $line"
  assignments+=("$line")
done <"$env_file"
named="$(grep -oE '^#?AEP_[A-Z0-9_]+=' "$env_file" | tr -d '#=' | sort -u)"
[[ -n "$named" ]] || fail "$env_file names no AEP_ variable"
for name in $named; do
  # A flag's variable is listed as `[env: NAME=…]` (`[env: NAME]` for a hidden value);
  # AEP_LOG, the logger's, is named in the help's text.
  grep -qE "\[env: $name[]=]" "$scratch/help.out" ||
    { [[ "$name" == AEP_LOG ]] && grep -qw AEP_LOG "$scratch/help.out"; } ||
    fail "$env_file names $name, which aep-relay --help does not list"
done
echo "deb: $env_file: $(wc -w <<<"$named") variables, all read by aep-relay; set: ${assignments[*]:-none}"

# Start. As systemd would: the command as written, a clean environment, the file's
# variables. Unlike systemd, as the current user (not a DynamicUser) and with a temp dir
# standing in for the StateDirectory: every value under /var/lib/$state_dir is moved
# there (the service's AEP_HISTORY). AEP_LISTEN is then set to port 0 (the file keeps the
# default 127.0.0.1:8787, which may be taken on a shared machine), like a drop-in would.
state="$scratch/state/$state_dir"
mkdir -p "$state"
environment=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "STATE_DIRECTORY=$state")
for a in "${assignments[@]}"; do
  value="${a#*=}"
  if [[ "$value" == "/var/lib/$state_dir" || "$value" == "/var/lib/$state_dir/"* ]]; then
    value="$state${value#"/var/lib/$state_dir"}"
  fi
  environment+=("${a%%=*}=$value")
done
environment+=(AEP_LISTEN=127.0.0.1:0)
# The log exists before the relay starts: the background job opens its redirection only
# after the fork, and the poll below must not read a file that is not there yet.
: >"$log"
env -i "${environment[@]}" "${command[@]}" </dev/null >"$scratch/relay.stdout" 2>"$log" &
pid=$!

addr=""
deadline=$((SECONDS + 30))
while [[ -z "$addr" ]]; do
  addr="$(sed -n 's/^.*aep-relay listening on \([^ ]*\) (.*/\1/p' "$log" | head -n 1)"
  [[ -n "$addr" ]] && break
  kill -0 "$pid" 2>/dev/null || fail "$exec_start exited before its start-up line"
  ((SECONDS < deadline)) || fail "no start-up line within 30 s"
  sleep 0.1
done
echo "deb: $exec_start (with $env_file) listens on $addr"

health="$(curl -sS --max-time 10 -w '\n%{http_code}' "http://$addr/healthz")" || fail "GET /healthz failed"
code="${health##*$'\n'}"
body="${health%$'\n'*}"
[[ "$code" == 200 && "$body" == *'"ok":true'* ]] || fail "GET /healthz answered $code: $body"
echo "deb: GET /healthz 200 $body"

# A stream open across the stop: the drain must end it with `: shutting-down`.
: >"$scratch/stream.out"
: >"$scratch/stream.err"
curl -sS -N --max-time $((stop_timeout + 30)) "http://$addr/stream" >"$scratch/stream.out" 2>"$scratch/stream.err" &
stream_pid=$!
deadline=$((SECONDS + 15))
until grep -qs '^: aep-relay stream open' "$scratch/stream.out"; do
  kill -0 "$stream_pid" 2>/dev/null || fail "GET /stream ended before it opened: $(cat "$scratch/stream.err")"
  ((SECONDS < deadline)) || fail "GET /stream did not open within 15 s"
  sleep 0.1
done

# An Event POSTed is kept in the history directory that the environment file names.
event='{"aep":"0.1","id":"01JX9YB3P4T9","type":"tool.completed","time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/claude-code/session/s_8f2c","agent":"claude-code","session":"s_8f2c","seq":187,"data":{"tool":{"name":"Bash"},"status":"success"}}'
code="$(curl -sS --max-time 10 -o "$scratch/post.out" -w '%{http_code}' -X POST "http://$addr/events" \
  -H 'AEP-Version: 0.1' -H 'Content-Type: application/json' --data-binary "$event")" || fail "POST /events failed"
[[ "$code" == 202 ]] || fail "POST /events answered $code: $(cat "$scratch/post.out")"
history_file="$state/claude-code/s_8f2c.jsonl"
grep -qF '"id":"01JX9YB3P4T9"' "$history_file" 2>/dev/null ||
  fail "the POSTed Event is not in $history_file (AEP_HISTORY from $env_file)"
echo "deb: POST /events 202; the Event is in the state directory's history (${history_file#"$scratch/state/"})"
deadline=$((SECONDS + 15))
until grep -qs '"id":"01JX9YB3P4T9"' "$scratch/stream.out"; do
  ((SECONDS < deadline)) || fail "the open stream did not deliver the POSTed Event within 15 s"
  sleep 0.1
done

# SIGTERM (the unit's KillSignal): drained and exit 0 within TimeoutStopSec.
kill -TERM "$pid"
deadline=$((SECONDS + stop_timeout))
while kill -0 "$pid" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "still running ${stop_timeout} s (TimeoutStopSec) after SIGTERM"
  sleep 0.1
done
status=0
wait "$pid" || status=$?
pid=""
[[ "$status" -eq 0 ]] || fail "the relay exited $status after SIGTERM (want 0)"
grep -q 'shutdown complete' "$log" || fail "no 'shutdown complete' line after SIGTERM"
deadline=$((SECONDS + 15))
while kill -0 "$stream_pid" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "the open stream did not end within 15 s of the relay's exit"
  sleep 0.1
done
wait "$stream_pid" 2>/dev/null || true
stream_pid=""
grep -q '^: shutting-down' "$scratch/stream.out" || fail "the open stream did not end with ': shutting-down'"
echo "deb: SIGTERM: the open stream ended with ': shutting-down', exit 0, shutdown complete"

$sudo dpkg --purge "$pkg" </dev/null >"$scratch/purge.out" 2>&1 || {
  cat "$scratch/purge.out" >&2
  fail "dpkg --purge $pkg failed"
}
installed=""
for f in "$bin" "$unit" /etc/default/$pkg; do
  [[ ! -e "$f" ]] || fail "$f is still there after dpkg --purge"
done
echo "deb: dpkg --purge $pkg: $bin, $unit and /etc/default/$pkg are gone"
