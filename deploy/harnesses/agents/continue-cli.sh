# Continue CLI (`cn -p`, headless; --auto allows every tool), an OpenAI
# provider on the proxy from a config file of its own: no hub, no login.
# Telemetry and metrics off; its state under the sandbox's home.
mkdir -p "$HOME/.continue"
cat >"$HOME/.continue/forgelog.yaml" <<YAML
name: forgelog
version: 0.0.1
schema: v1
models:
  - name: forgelog
    provider: openai
    model: forgelog
    apiBase: $FORGELOG_BASE_URL/v1
    apiKey: $FORGELOG_API_KEY
    roles: [chat, edit, apply]
YAML
export CONTINUE_CLI_ENABLE_TELEMETRY=0 CONTINUE_METRICS_ENABLED=0 CONTINUE_GLOBAL_DIR="$HOME/.continue"
status=0
node "$FORGELOG_BUNDLES/continue-cli/node_modules/.bin/cn" --config "$HOME/.continue/forgelog.yaml" \
  --auto -p --format json "$(cat "$FORGELOG_INSTRUCTION")" || status=$?
# Its own record of the session (the messages), beside the harness's output.
cp -r "$HOME/.continue/sessions" "$FORGELOG_AGENT_LOGS/continue-sessions" 2>/dev/null || true
exit "$status"
