#!/usr/bin/env bash
# Runs the whole test suite against a real broker: a private tansu started here
# (unless FORGELOG_BROKERS points at one), stopped by its PID at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FORGELOG_HOME/target}

cargo build --workspace --all-targets

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

cargo test --workspace -- --test-threads 2
