# gptme (`gptme -n --output-format json`), its `local` provider (any
# OpenAI-compatible server, by OPENAI_BASE_URL) on the proxy, native tool
# calls (`--tool-format tool`) with its shell, read and save tools. Prints
# each message as a JSON line; its conversation log goes to the agent logs.
# It also asks the model for a title (a call on a root of its own), and
# fetches tiktoken's vocabulary at start: offline it says so and counts
# tokens by characters. Its telemetry needs OpenTelemetry, which it lacks.
# The bundle is a venv whose site-packages run on the sandbox's python3 (the
# same minor version; the venv's own interpreter is a link to this host's).
site=$(echo "$FORGELOG_BUNDLES"/gptme/lib/python3*/site-packages)
export PYTHONPATH="$site" OPENAI_BASE_URL="$FORGELOG_BASE_URL/v1" \
  OPENAI_API_KEY="$FORGELOG_API_KEY" GPTME_LOGS_HOME="$FORGELOG_AGENT_LOGS/gptme"
exec python3 -c 'import sys; from gptme.cli.main import main; sys.argv[0] = "gptme"; sys.exit(main())' \
  -n --model local/forgelog --tool-format tool -t shell,read,save --output-format json \
  --name forgelog "$(cat "$FORGELOG_INSTRUCTION")"
