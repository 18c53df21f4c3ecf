# Codex CLI (`codex exec`), a model provider on the proxy's Responses API.
mkdir -p "$HOME/codex"
cat >"$HOME/codex/config.toml" <<TOML
model = "forgelog"
model_provider = "forgelog"
check_for_update_on_startup = false
[analytics]
enabled = false
[model_providers.forgelog]
name = "forgelog"
base_url = "$FORGELOG_BASE_URL/v1"
env_key = "FORGELOG_API_KEY"
wire_api = "responses"
[features]
plugins = false
TOML
export CODEX_HOME="$HOME/codex"
exec node "$FORGELOG_BUNDLES/codex/node_modules/.bin/codex" exec --skip-git-repo-check \
  --dangerously-bypass-approvals-and-sandbox --json "$(cat "$FORGELOG_INSTRUCTION")"
