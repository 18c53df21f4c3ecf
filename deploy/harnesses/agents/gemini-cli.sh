# Gemini CLI, headless (`gemini -p ... -o json`), its Gemini API base URL the proxy.
mkdir -p "$HOME/.gemini"
cat >"$HOME/.gemini/settings.json" <<JSON
{"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": false},
 "telemetry": {"enabled": false}, "general": {"disableAutoUpdate": true, "disableUpdateNag": true}}
JSON
export GEMINI_API_KEY="$FORGELOG_API_KEY" GOOGLE_GEMINI_BASE_URL="$FORGELOG_BASE_URL" \
  GEMINI_CLI_NO_RELAUNCH=true GEMINI_CLI_TRUST_WORKSPACE=true
exec node "$FORGELOG_BUNDLES/gemini-cli/node_modules/.bin/gemini" -m forgelog --yolo -o json \
  -p "$(cat "$FORGELOG_INSTRUCTION")"
