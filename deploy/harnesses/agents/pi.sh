# pi (`pi -p --mode json`), a custom OpenAI-compatible provider on the proxy.
mkdir -p "$HOME/.pi/agent"
cat >"$HOME/.pi/agent/models.json" <<JSON
{"providers": {"forgelog": {"baseUrl": "$FORGELOG_BASE_URL/v1", "api": "openai-completions",
  "apiKey": "$FORGELOG_API_KEY",
  "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
  "models": [{"id": "forgelog"}]}}}
JSON
export PI_OFFLINE=1
exec node "$FORGELOG_BUNDLES/pi/node_modules/.bin/pi" --provider forgelog --model forgelog \
  --mode json --no-session -p "$(cat "$FORGELOG_INSTRUCTION")"
