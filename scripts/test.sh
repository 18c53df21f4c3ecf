#!/usr/bin/env bash
# Runs the whole test suite against a real broker: a private tansu started here
# (unless FORGELOG_BROKERS points at one), stopped by its PID at the end.
#
#   scripts/test.sh                 every test, each within its budget (scripts/test-budgets.toml)
#   scripts/test.sh --soak          the kill/chaos tests 10x longer, budgets 10x (not in CI)
#   scripts/test.sh [--soak] ARGS   ARGS go to `cargo nextest run` (a filter, `-p CRATE`, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
export FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FORGELOG_HOME/target}
soak=()
if [ "${1:-}" = --soak ]; then
  soak=(--soak)
  export FORGELOG_SOAK=10
  shift
fi

# Cargo names workspace artifacts and checks their freshness relative to the
# workspace root, but bakes each crate's absolute CARGO_MANIFEST_DIR into it:
# test binaries last built from another checkout of the same sources (CI's,
# in a shared target directory) read their fixtures there, and sources older
# than them are not rebuilt. After such a move the sources are made new.
mark="$CARGO_TARGET_DIR/.forgelog-checkout"
here=$(pwd -P)
if [ -f "$mark" ] && [ "$(cat "$mark")" != "$here" ]; then
  echo "test: $CARGO_TARGET_DIR was last built from $(cat "$mark"): rebuilding this checkout's crates" >&2
  find . -name '*.rs' -not -path './target/*' -not -path './.git/*' -exec touch {} +
fi
mkdir -p "$CARGO_TARGET_DIR" && echo "$here" >"$mark"

# What the tests need beyond the broker and the model: the test runner,
# sandboxes, Chromium, the Python venvs (SDKs, torch, vLLM). Seconds when there.
scripts/test-setup.sh

# One build of every test binary (and the forgelog binary they run).
t0=$SECONDS
cargo nextest run --workspace --no-run
echo "test: build took $((SECONDS - t0)) s" >&2

pid=""
data=""
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ -n "$data" ]; then rm -rf "$data"; fi
}
trap cleanup EXIT

if [ -z "${FORGELOG_BROKERS:-}" ]; then
  port=${FORGELOG_TEST_PORT:-19092}
  data=$(mktemp -d -t forgelog-test-broker.XXXXXX)
  "$CARGO_TARGET_DIR/debug/forgelog" broker --data "$data" --listen "127.0.0.1:$port" &
  pid=$!
  export FORGELOG_BROKERS="127.0.0.1:$port"
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "test: the broker exited; see $data/broker.log" >&2; cat "$data/broker.log" >&2 || true; exit 1; }
    sleep 0.2
  done
fi
echo "test: broker at $FORGELOG_BROKERS" >&2
"$CARGO_TARGET_DIR/debug/forgelog" topics create

budgets="$CARGO_TARGET_DIR/nextest-budgets.toml"
python3 scripts/test-budgets.py config "$CARGO_TARGET_DIR/nextest" "${soak[@]}" >"$budgets"
junit="$CARGO_TARGET_DIR/nextest/default/junit.xml"
rm -f "$junit"
t0=$SECONDS
status=0
# `-p CRATE` runs that crate's tests: with `--workspace` beside it, cargo ran them all.
scope=(--workspace)
for arg in "$@"; do
  case "$arg" in -p | -p* | --package | --package=*) scope=() ;; esac
done
cargo nextest run "${scope[@]}" --config-file "$budgets" "$@" || status=$?
echo "test: tests took $((SECONDS - t0)) s" >&2
if [ -f "$junit" ]; then
  python3 scripts/test-budgets.py report "$junit" "${soak[@]}" || status=1
fi
exit "$status"
