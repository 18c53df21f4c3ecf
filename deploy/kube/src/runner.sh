# The in-pod runner of a forgelog rollout attempt on Kubernetes: the harness
# (its launch script) in /app within the agent timeout, then the task's tests
# copied in and its verifier within the verifier timeout (after an agent
# timeout too), then how both ended, and what the verifier wrote, as the
# container's termination message (read back through the API server: no exec).
# Task files come from the attempt's ConfigMap at /forgelog/task.
set -u
mkdir -p /logs/agent /logs/verifier /app "$HOME"
cd /app
if [ "$FORGELOG_LAUNCH" = solve ]; then
  mkdir -p /solution && cp /forgelog/task/solve.sh /solution/solve.sh
  launch=/solution/solve.sh
else
  launch=/forgelog/task/launch.sh
fi
timeout -s KILL "$FORGELOG_AGENT_TIMEOUT" bash "$launch" </dev/null >/logs/agent/stdout 2>/logs/agent/stderr
code=$?
if [ $code = 137 ]; then agent=timed_out; else agent="exit:$code"; fi
mkdir -p /tests && tar -xf /forgelog/task/tests.tar -C /tests
cd /
timeout -s KILL "$FORGELOG_VERIFIER_TIMEOUT" bash /tests/test.sh </dev/null >/logs/verifier/stdout 2>/logs/verifier/stderr
code=$?
if [ $code = 137 ]; then verifier=timed_out; else verifier="exit:$code"; fi
# A termination message holds 4096 bytes: the reward files, base64, cut short.
b64() { if [ -f "$1" ]; then head -c 1200 "$1" | base64 -w0; else printf -- -; fi; }
printf '{"agent":"%s","verifier":"%s","reward_json":"%s","reward_txt":"%s"}' \
  "$agent" "$verifier" "$(b64 /logs/verifier/reward.json)" "$(b64 /logs/verifier/reward.txt)" \
  >/dev/termination-log
