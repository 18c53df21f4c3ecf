#!/usr/bin/env bash
# Installs the harnesses forgelog is tested with (kit.txt: name, installer,
# package, pinned version) into $FORGELOG_HOME/harnesses (outside the clone):
# an npm harness into a prefix of its own, run by the kit's node 22 (npm
# package `node`); a pip harness (mini-swe-agent, aider, and the SDKs whose
# agent is their launch script) into a venv of its own.
# Idempotent: a harness whose pinned version is already there is skipped.
# Usage: install.sh [NAME ...] (default: every harness in kit.txt)
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
H="$FORGELOG_HOME/harnesses"
KIT="$(dirname "$0")/kit.txt"
# The rows of kit.txt without its comments: name installer package version.
rows() { grep -v '^#' "$KIT" | awk 'NF == 4'; }

mkdir -p "$H"
stamp_ok() { [ "$(cat "$1/.forgelog-version" 2>/dev/null)" = "$2" ]; }
timed() { local what=$1 t0=$SECONDS; shift; "$@"; echo "install: $what ready ($((SECONDS - t0)) s)" >&2; }

npm_install() { # DIR VERSION PACKAGE@VERSION
  local dir=$1 version=$2 spec=$3
  if stamp_ok "$dir" "$version"; then echo "install: $spec present" >&2; return; fi
  rm -rf "$dir"; mkdir -p "$dir"
  PATH="$H/node/bin:$PATH" npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$spec" >&2
  echo "$version" >"$dir/.forgelog-version"
}

node22() {
  local NODE_VERSION
  NODE_VERSION=$(rows | awk '$1 == "node" { print $4 }')
  npm_install "$H/node" "$NODE_VERSION" "node@$NODE_VERSION"
  # The `node` package's bin is a launcher; link the real binary where PATH can find it.
  mkdir -p "$H/node/bin"
  ln -sf ../node_modules/node/bin/node "$H/node/bin/node"
  "$H/node/bin/node" --version | grep -q "^v${NODE_VERSION}$" || { echo "install: node $NODE_VERSION did not install" >&2; exit 1; }
}

pip_venv() { # DIR VERSION PACKAGE==VERSION: a Python harness in a venv of its own
  local dir=$1 version=$2 spec=$3
  if stamp_ok "$dir" "$version"; then echo "install: $spec present" >&2; return; fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check "$spec" >&2
  echo "$version" >"$dir/.forgelog-version"
}

want=("$@")
[ ${#want[@]} -gt 0 ] || mapfile -t want < <(rows | awk '$1 != "node" { print $1 }')
for w in "${want[@]}"; do
  installer=""
  read -r _ installer package version < <(rows | awk -v w="$w" '$1 == w && w != "node"') || true
  case ${installer:-} in
    npm) timed "node" node22; timed "$w $version" npm_install "$H/$w" "$version" "$package@$version" ;;
    pip) timed "$w $version" pip_venv "$H/$w" "$version" "$package==$version" ;;
    *) echo "install: unknown harness '$w' (one of: $(rows | awk '$1 != "node" { print $1 }' | paste -sd' '))" >&2; exit 2 ;;
  esac
done
echo "install: harnesses ready in $H" >&2
