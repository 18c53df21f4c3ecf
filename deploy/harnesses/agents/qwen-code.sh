# Qwen Code, headless (`qwen ... -o json`), an OpenAI-compatible provider on the proxy.
mkdir -p "$HOME/.qwen"
cat >"$HOME/.qwen/settings.json" <<JSON
{"privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false},
 "general": {"disableAutoUpdate": true, "disableUpdateNag": true}}
JSON
exec node "$FORGELOG_BUNDLES/qwen-code/node_modules/.bin/qwen" --auth-type openai \
  --openai-base-url "$FORGELOG_BASE_URL/v1" --openai-api-key "$FORGELOG_API_KEY" -m forgelog \
  --yolo -o json "$(cat "$FORGELOG_INSTRUCTION")"
