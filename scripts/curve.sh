#!/usr/bin/env bash
# The learning curve of a real harness (issue 43): mini-swe-agent in podman
# sandboxes on hello-file, trained with GRPO through a real vLLM (CPU) that
# serves each published version. SmolLM2-135M writes no tool call of its own,
# so vLLM holds each answer to a `bash` tool call running one of four
# commands, one of them the task's answer (the base policy picks it in about
# half the rollouts: tests/vllm/main.rs). One group of 8 rollouts (2 model calls
# each) per version, on policy, EPOCHS versions at learning rate LR (full
# weights; at 1e-4 one step took the group from 6 of 8 solved to 8 of 8, so
# the curve is a step); the last line is
# `forgelog report`'s first-5 / last-5 mean reward; the HTML report goes to
# docs/curve.html.
#   scripts/curve.sh [EPOCHS] [LR]   (defaults 20, 2e-5; about 2.5 minutes a
#   version that trains on 2 cores, 1 once every rollout solves the task)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-20}
lr=${2:-2e-5}
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
export FORGELOG_HOME CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FORGELOG_HOME/target}
scripts/vllm-env.sh
cargo build --quiet --bin forgelog
forgelog=$CARGO_TARGET_DIR/debug/forgelog
work=$(mktemp -d)
run=curve-$(date +%s)
# The run's log outlives the script (report reads it again from there).
log="$FORGELOG_HOME/curve/$run"
mkdir -p "$log"
vllm=0 broker=0
stop() {
  # vLLM runs in its own process group (its engine is a child process).
  if [ "$vllm" -gt 0 ]; then kill -- "-$vllm" 2>/dev/null || true; fi
  if [ "$broker" -gt 0 ]; then kill "$broker" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap stop EXIT
cargo run --quiet -p forgelog-model --example hf-folder -- --untied smollm2 "$work/model"
"$forgelog" broker --data "$log" --listen 127.0.0.1:19600 >"$work/broker.log" 2>&1 &
broker=$!
setsid scripts/vllm-serve.sh "$work/model" 18100 >"$work/vllm.log" 2>&1 &
vllm=$!
until curl -sf 127.0.0.1:18100/v1/models >/dev/null; do sleep 2; done
grammar=$(python3 - <<'PY'
import json, re
commands = ["echo 'Hello, forgelog!' > /app/hello.txt", "ls /app", "head -3 /app/data.txt", "wc -l /app/data.txt"]
choices = "|".join(re.sub(r'([.|()\[\]{}*+?^$\\])', r'\\\1', c) for c in commands)
regex = '<tool_call>\n\\{"name": "bash", "arguments": \\{"command": "(' + choices + ')"\\}\\}\n</tool_call>'
print(json.dumps({"structured_outputs": {"regex": regex}}))
PY
)
start=$SECONDS
"$forgelog" run deploy/tasks --task hello-file --harness mini-swe-agent --run "$run" \
  --group-size 8 --epochs "$epochs" --concurrency 4 --max-model-calls 2 --max-tokens 96 \
  --upstream http://127.0.0.1:18100 --engine vllm --model "$work/model" --tokenizer "$work/model" \
  --extra-body "$grammar" --brokers 127.0.0.1:19600 \
  --train --groups-per-step 1 --max-staleness 0 --learning-rate "$lr"
echo "curve: $epochs versions at learning rate $lr in $((SECONDS - start)) s" >&2
mkdir -p docs
"$forgelog" report --run "$run" --brokers 127.0.0.1:19600 --html docs/curve.html
echo "curve: the run's log is in $log (forgelog broker --data $log serves it again)" >&2
