# Gemini CLI, headless (`gemini -p ... -o json`), its Gemini API base URL the proxy.
# Skills off: Gemini CLI 0.61.0 lists its built-in skills in its system prompt
# in the order an unsorted async glob finds them, so the same task's prompt
# could differ from run to run.
mkdir -p "$HOME/.gemini"
cat >"$HOME/.gemini/settings.json" <<JSON
{"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": false},
 "telemetry": {"enabled": false}, "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
 "skills": {"enabled": false}}
JSON
export GEMINI_API_KEY="$FORGELOG_API_KEY" GOOGLE_GEMINI_BASE_URL="$FORGELOG_BASE_URL" \
  GEMINI_CLI_NO_RELAUNCH=true GEMINI_CLI_TRUST_WORKSPACE=true
exec node "$FORGELOG_BUNDLES/gemini-cli/node_modules/.bin/gemini" -m forgelog --yolo -o json \
  -p "$(cat "$FORGELOG_INSTRUCTION")"
