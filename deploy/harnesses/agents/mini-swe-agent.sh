# mini-swe-agent, through LiteLLM's OpenAI provider on the proxy. The bundle
# is a venv; its site-packages run on the sandbox's own python3 (the same
# minor version), so the venv's interpreter path need not exist here.
site=$(echo "$FORGELOG_BUNDLES"/mini-swe-agent/lib/python3*/site-packages)
export PYTHONPATH="$site" MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors \
  LITELLM_LOCAL_MODEL_COST_MAP=True OPENAI_API_KEY="$FORGELOG_API_KEY" \
  OPENAI_API_BASE="$FORGELOG_BASE_URL/v1"
exec python3 -c 'import sys; from minisweagent.run.mini import app; sys.argv[0] = "mini"; sys.exit(app())' \
  -m openai/forgelog -t "$(cat "$FORGELOG_INSTRUCTION")" -y --exit-immediately \
  -o "$FORGELOG_AGENT_LOGS/trajectory.json" -c mini.yaml \
  -c "model.model_kwargs.api_base=$FORGELOG_BASE_URL/v1" -c "model.model_kwargs.api_key=$FORGELOG_API_KEY"
