#!/usr/bin/env bash
# Installs the harnesses forgelog is tested with, at pinned versions, into
# $FORGELOG_HOME/harnesses (outside the clone): node 22 (npm package `node`);
# Claude Code, Codex, OpenCode, Gemini CLI, Qwen Code, pi, Grok CLI,
# Continue CLI and Cline (npm --prefix);
# mini-swe-agent, aider, the OpenAI Agents SDK and the Claude Agent SDK (a
# venv each; an SDK's agent is its launch script).
# Idempotent: a harness whose pinned version is already there is skipped.
# Usage: install.sh [claude-code|codex|opencode|mini-swe-agent|gemini-cli|qwen-code|pi|aider|openai-agents|grok-cli|continue-cli|claude-agent-sdk|cline ...] (default: all)
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
H="$FORGELOG_HOME/harnesses"
# shellcheck source=versions.sh
. "$(dirname "$0")/versions.sh"

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
[ ${#want[@]} -gt 0 ] || want=(claude-code codex opencode mini-swe-agent gemini-cli qwen-code pi aider openai-agents grok-cli continue-cli claude-agent-sdk cline)
for w in "${want[@]}"; do
  case $w in
    claude-code) timed "node $NODE_VERSION" node22; timed "claude-code $CLAUDE_CODE_VERSION" npm_install "$H/claude-code" "$CLAUDE_CODE_VERSION" "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" ;;
    codex) timed "codex $CODEX_VERSION" npm_install "$H/codex" "$CODEX_VERSION" "@openai/codex@$CODEX_VERSION" ;;
    opencode) timed "opencode $OPENCODE_VERSION" npm_install "$H/opencode" "$OPENCODE_VERSION" "opencode-ai@$OPENCODE_VERSION" ;;
    mini-swe-agent) timed "mini-swe-agent $MINI_SWE_AGENT_VERSION" pip_venv "$H/mini-swe-agent" "$MINI_SWE_AGENT_VERSION" "mini-swe-agent==$MINI_SWE_AGENT_VERSION" ;;
    qwen-code) timed "node $NODE_VERSION" node22; timed "qwen-code $QWEN_CODE_VERSION" npm_install "$H/qwen-code" "$QWEN_CODE_VERSION" "@qwen-code/qwen-code@$QWEN_CODE_VERSION" ;;
    gemini-cli) timed "node $NODE_VERSION" node22; timed "gemini-cli $GEMINI_CLI_VERSION" npm_install "$H/gemini-cli" "$GEMINI_CLI_VERSION" "@google/gemini-cli@$GEMINI_CLI_VERSION" ;;
    pi) timed "node $NODE_VERSION" node22; timed "pi $PI_VERSION" npm_install "$H/pi" "$PI_VERSION" "@mariozechner/pi-coding-agent@$PI_VERSION" ;;
    aider) timed "aider $AIDER_VERSION" pip_venv "$H/aider" "$AIDER_VERSION" "aider-chat==$AIDER_VERSION" ;;
    grok-cli) timed "node $NODE_VERSION" node22; timed "grok-cli $GROK_CLI_VERSION" npm_install "$H/grok-cli" "$GROK_CLI_VERSION" "@vibe-kit/grok-cli@$GROK_CLI_VERSION" ;;
    continue-cli) timed "node $NODE_VERSION" node22; timed "continue-cli $CONTINUE_CLI_VERSION" npm_install "$H/continue-cli" "$CONTINUE_CLI_VERSION" "@continuedev/cli@$CONTINUE_CLI_VERSION" ;;
    claude-agent-sdk) timed "claude-agent-sdk $CLAUDE_AGENT_SDK_VERSION" pip_venv "$H/claude-agent-sdk" "$CLAUDE_AGENT_SDK_VERSION" "claude-agent-sdk==$CLAUDE_AGENT_SDK_VERSION" ;;
    cline) timed "node $NODE_VERSION" node22; timed "cline $CLINE_VERSION" npm_install "$H/cline" "$CLINE_VERSION" "cline@$CLINE_VERSION" ;;
    openai-agents) timed "openai-agents $OPENAI_AGENTS_VERSION" pip_venv "$H/openai-agents" "$OPENAI_AGENTS_VERSION" "openai-agents==$OPENAI_AGENTS_VERSION" ;;
    *) echo "install: unknown harness '$w' (claude-code, codex, opencode, mini-swe-agent, gemini-cli, qwen-code, pi, aider, openai-agents, grok-cli, continue-cli, claude-agent-sdk, cline)" >&2; exit 2 ;;
  esac
done
echo "install: harnesses ready in $H" >&2
