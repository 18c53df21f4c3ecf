#!/usr/bin/env bash
# Creates the Python venv the proxy's integration tests drive the official SDKs
# from: ${FORGELOG_HOME:-$HOME/.cache/forgelog}/venv. Idempotent; versions pinned.
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
VENV="$FORGELOG_HOME/venv"
PINS=(openai==3.51.0 anthropic==2.10.0)

if [ ! -x "$VENV/bin/python3" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python3" -m pip freeze 2>/dev/null | grep -qxF "${PINS[0]}" \
   || ! "$VENV/bin/python3" -m pip freeze 2>/dev/null | grep -qxF "${PINS[1]}"; then
  "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
fi
echo "setup: python venv ready at $VENV (${PINS[*]})" >&2
