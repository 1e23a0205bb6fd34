# Sourced by tests/clients/run.sh and sdk.sh, from the repository's root, with `venv` and
# `out` set: what both need before and around their Python harness.
#   target          CARGO_TARGET_DIR (honoured, as cargo does) or target
#   need_deb        a Debian package when its command is missing (apt-get runs only then;
#                   CI runs as root)
#   need_python_venv, need_nats_server
#   need_venv       the runner's virtual environment, created with its PyPI packages
#   build_relay     cargo build; `bin` is the binary; `out` is emptied
#   run_harness     the harness, bounded by `timeout` and stopped with the runner

target="${CARGO_TARGET_DIR:-target}"

apt_updated=""
need_deb_always() { # need_deb_always PACKAGE...
  echo "installing $* (Debian)"
  if [[ -z "$apt_updated" ]]; then
    apt-get update -q
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}
need_deb() { # need_deb COMMAND PACKAGE...: PACKAGE... when COMMAND is missing
  local cmd="$1"
  shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  need_deb_always "$@"
}

need_python_venv() {
  need_deb python3 python3 python3-venv
  # Debian ships `python3 -m venv` (ensurepip) in a package of its own.
  python3 -c 'import ensurepip' 2>/dev/null || need_deb_always python3-venv
}

need_nats_server() { # the cluster checks' engine
  # Debian puts it in /usr/sbin, which a user's PATH may lack.
  [[ -x /usr/sbin/nats-server ]] || need_deb nats-server nats-server
}

# need_venv INSTALLED PACKAGE...: $venv, unless its python runs INSTALLED (a check that
# the packages are there, as pinned), is created afresh with PACKAGE... from PyPI.
need_venv() {
  local installed="$1"
  shift
  if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "$installed" 2>/dev/null; then
    echo "installing $* (PyPI) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$@"
  fi
}

build_relay() {
  cargo build --locked --bin aep-relay
  bin="$target/debug/aep-relay"
  rm -rf "$out"
  mkdir -p "$out"
}

# run_harness SECONDS SCRIPT ARG...: `$venv/bin/python SCRIPT ARG...`, then exits with its
# status. The checks bound each of their waits; `timeout` bounds the whole run. The
# harness stops every process it started when it ends or is terminated. (No __pycache__
# is left in tests/clients by its import of harness.py.)
harness=""
cleanup() {
  if [[ -n "$harness" ]] && kill -0 "$harness" 2>/dev/null; then
    kill -TERM "$harness" 2>/dev/null || true
    wait "$harness" 2>/dev/null || true
  fi
}
run_harness() {
  local seconds="$1"
  shift
  trap cleanup EXIT
  trap 'exit 143' TERM INT HUP
  PYTHONDONTWRITEBYTECODE=1 timeout --kill-after=15s "$seconds" "$venv/bin/python" "$@" &
  harness=$!
  local status=0
  wait "$harness" || status=$?
  harness=""
  exit "$status"
}
