# Grok CLI (`grok -p`, headless: every message as a JSON line), an
# OpenAI-compatible provider on the proxy. It writes its settings to
# ~/.grok (the sandbox's home); it has no telemetry to turn off.
export GROK_API_KEY="$FORGELOG_API_KEY" GROK_BASE_URL="$FORGELOG_BASE_URL/v1" GROK_MODEL=forgelog
exec node "$FORGELOG_BUNDLES/grok-cli/node_modules/.bin/grok" -m forgelog \
  -p "$(cat "$FORGELOG_INSTRUCTION")"
