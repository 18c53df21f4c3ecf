# Claude Code, headless (`claude -p`), its Anthropic base URL the proxy.
# Runs in the sandbox's /app; see README "Harness bundles" for the environment.
export ANTHROPIC_BASE_URL="$FORGELOG_BASE_URL" ANTHROPIC_API_KEY="$FORGELOG_API_KEY" \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
  DISABLE_ERROR_REPORTING=1 IS_SANDBOX=1
exec "$FORGELOG_BUNDLES/claude-code/node_modules/.bin/claude" -p "$(cat "$FORGELOG_INSTRUCTION")" \
  --output-format json --dangerously-skip-permissions
