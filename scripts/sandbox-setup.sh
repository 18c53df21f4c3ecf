#!/usr/bin/env bash
# Installs what sandboxed rollouts (`forgelog run`) need: podman with runc,
# debootstrap and the shipped tasks' local base image, iproute2 for each
# sandbox's network, libfaketime for `run --replay --pin-clock`, and the
# harness bundles (pinned versions, into $FORGELOG_HOME/harnesses).
# Idempotent; about 4 min cold, seconds when everything is there.
set -euo pipefail
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
"$(dirname "$0")/base-image.sh"

# The eight real harnesses `forgelog run` puts in sandboxes (and
# tests/harnesses.rs runs through the proxy); about 1.5 min cold.
"$(dirname "$0")/../deploy/harnesses/install.sh"
