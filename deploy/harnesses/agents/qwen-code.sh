# Qwen Code, headless (`qwen ... -o json`), an OpenAI-compatible provider on the proxy.
# Its shell tool runs in a PTY (`enableInteractiveShell`): a one-shot prompt
# otherwise runs commands as plain child processes and settles on the child's
# `exit` without waiting for its output to `close`, so a quick command's
# output can come back as `(empty)` (Qwen Code 0.24.4); the PTY path waits.
mkdir -p "$HOME/.qwen"
cat >"$HOME/.qwen/settings.json" <<JSON
{"privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false},
 "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
 "tools": {"shell": {"enableInteractiveShell": true}}}
JSON
exec node "$FORGELOG_BUNDLES/qwen-code/node_modules/.bin/qwen" --auth-type openai \
  --openai-base-url "$FORGELOG_BASE_URL/v1" --openai-api-key "$FORGELOG_API_KEY" -m forgelog \
  --yolo -o json "$(cat "$FORGELOG_INSTRUCTION")"
