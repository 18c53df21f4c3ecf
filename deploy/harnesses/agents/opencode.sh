# OpenCode (`opencode run`), an OpenAI-compatible provider on the proxy.
cat >opencode.json <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "autoupdate": false,
  "share": "disabled",
  "model": "forgelog/forgelog",
  "provider": {
    "forgelog": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "forgelog",
      "options": {"baseURL": "$FORGELOG_BASE_URL/v1", "apiKey": "$FORGELOG_API_KEY"},
      "models": {"forgelog": {"name": "forgelog"}}
    }
  }
}
JSON
export OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_LSP_DOWNLOAD=1
"$FORGELOG_BUNDLES/opencode/node_modules/.bin/opencode" run --format json "$(cat "$FORGELOG_INSTRUCTION")"
code=$?
rm -f opencode.json
exit $code
