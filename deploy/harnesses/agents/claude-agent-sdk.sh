# An agent on Anthropic's Claude Agent SDK (`claude-agent-sdk`): the SDK's
# `query` with Claude Code's own tools, permissions bypassed (the sandbox is
# the boundary), no settings files read; the SDK runs the Claude Code it
# bundles, its Anthropic base URL the proxy, telemetry, error reports and
# updates off. The SDK is a library, so the agent is this script. Prints one
# JSON line: the SDK's result (turns of the main agent, error or not).
site=$(echo "$FORGELOG_BUNDLES"/claude-agent-sdk/lib/python3*/site-packages)
export PYTHONPATH="$site" ANTHROPIC_BASE_URL="$FORGELOG_BASE_URL" ANTHROPIC_API_KEY="$FORGELOG_API_KEY" \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
  DISABLE_ERROR_REPORTING=1 IS_SANDBOX=1
exec python3 -c "$(cat <<'PY'
import json, os
import anyio
from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

async def main():
    options = ClaudeAgentOptions(permission_mode="bypassPermissions", setting_sources=[],
                                 cwd=os.getcwd(), max_turns=int(os.environ.get("FORGELOG_MAX_TURNS", "100")))
    result = None
    async for message in query(prompt=open(os.environ["FORGELOG_INSTRUCTION"]).read(), options=options):
        if isinstance(message, ResultMessage):
            result = message
    print(json.dumps({"num_turns": result.num_turns, "is_error": result.is_error,
                      "result": result.result}))
    raise SystemExit(1 if result.is_error else 0)

anyio.run(main)
PY
)"
