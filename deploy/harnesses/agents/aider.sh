# aider (`aider --message`), LiteLLM's OpenAI provider on the proxy; edits files
# from the answer's text (no tools), without git. The bundle is a venv; its
# site-packages run on the sandbox's own python3 (the same minor version).
site=$(echo "$FORGELOG_BUNDLES"/aider/lib/python3*/site-packages)
export PYTHONPATH="$site" OPENAI_API_KEY="$FORGELOG_API_KEY" OPENAI_API_BASE="$FORGELOG_BASE_URL/v1" \
  LITELLM_LOCAL_MODEL_COST_MAP=True AIDER_ANALYTICS=false
exec python3 -c 'import sys; from aider.main import main; sys.argv[0] = "aider"; sys.exit(main())' \
  --model openai/forgelog --weak-model openai/forgelog --message "$(cat "$FORGELOG_INSTRUCTION")" \
  --yes-always --no-git --no-check-update --analytics-disable --no-show-model-warnings --no-pretty \
  --no-fancy-input --map-tokens 0 --no-detect-urls --no-restore-chat-history
