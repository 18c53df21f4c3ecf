#!/usr/bin/env bash
# The learning curve of a real harness (issue 43): mini-swe-agent in podman
# sandboxes on the tasks of deploy/curve-tasks, trained with GRPO through
# forgelog's own engine (SmolLM2 on CPU; ENGINE=vllm: a real vLLM on CPU that
# serves each published version). SmolLM2-135M writes no tool call of its own,
# so the engine holds each answer to a `bash` tool call running one of the
# commands in deploy/curve-tasks/commands.txt: each task's answer is one of
# them, so the policy must learn which fits which instruction.
#   scripts/curve.sh base [GROUP]        each task once in a group of GROUP
#                                        (default 16), no training: the base rate
#   scripts/curve.sh train [EPOCHS] [LR] [GROUP]
#                                        EPOCHS passes over the tasks (default 5),
#                                        one group of GROUP (default 6) a
#                                        version, on policy, at learning rate LR
#                                        (default 2e-5); the report's HTML goes
#                                        to docs/curve.html
# The last line is `forgelog report`'s first-5 / last-5 mean reward.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-train}
case "$mode" in
  base) group=${2:-16} ;;
  train) epochs=${2:-5} lr=${3:-2e-5} group=${4:-6} ;;
  *) echo "usage: scripts/curve.sh base [GROUP] | train [EPOCHS] [LR] [GROUP]" >&2; exit 2 ;;
esac
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
export FORGELOG_HOME CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FORGELOG_HOME/target}
cargo build --quiet --bin forgelog
forgelog=$CARGO_TARGET_DIR/debug/forgelog
work=$(mktemp -d)
run=curve-$mode-$(date +%s)
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
"$forgelog" broker --data "$log" --listen 127.0.0.1:19600 >"$work/broker.log" 2>&1 &
broker=$!
engine=()
if [ "${ENGINE:-forgelog}" = vllm ]; then
  scripts/vllm-env.sh
  cargo run --quiet -p forgelog-model --example hf-folder -- --untied smollm2 "$work/model"
  setsid scripts/vllm-serve.sh "$work/model" 18100 >"$work/vllm.log" 2>&1 &
  vllm=$!
  until curl -sf 127.0.0.1:18100/v1/models >/dev/null; do sleep 2; done
  engine=(--upstream http://127.0.0.1:18100 --engine vllm --model "$work/model" --tokenizer "$work/model")
fi
grammar=$(python3 - deploy/curve-tasks/commands.txt <<'PY'
import json, re, sys
commands = [c for c in open(sys.argv[1]).read().splitlines() if c]
choices = "|".join(re.sub(r'([.|()\[\]{}*+?^$\\])', r'\\\1', c) for c in commands)
regex = '<tool_call>\n\\{"name": "bash", "arguments": \\{"command": "(' + choices + ')"\\}\\}\n</tool_call>'
print(json.dumps({"structured_outputs": {"regex": regex}}))
PY
)
args=(--harness mini-swe-agent --run "$run" --group-size "$group" --concurrency 3
  --max-model-calls 2 --max-tokens 96 --extra-body "$grammar" --brokers 127.0.0.1:19600)
if [ "$mode" = train ]; then
  args+=(--epochs "$epochs" --train --groups-per-step 1 --max-staleness 0 --learning-rate "$lr")
fi
start=$SECONDS
"$forgelog" run deploy/curve-tasks "${args[@]}" "${engine[@]}"
echo "curve: $mode in $((SECONDS - start)) s" >&2
html=()
if [ "$mode" = train ]; then mkdir -p docs && html=(--html docs/curve.html); fi
"$forgelog" report --run "$run" --brokers 127.0.0.1:19600 "${html[@]}"
echo "curve: the run's log is in $log (forgelog broker --data $log serves it again)" >&2
