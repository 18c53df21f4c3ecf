# An agent on Pydantic AI (`pydantic-ai-slim[openai]`), through OpenAI Chat
# Completions on the proxy: the library's own agent loop with three tools of
# ours (bash, read_file, write_file). Pydantic AI is a library, so the agent is
# this script; its Logfire instrumentation is off unless configured, and this
# script configures none. The bundle is a venv whose site-packages run on the
# sandbox's python3 (the same minor version). Prints one JSON line: the final
# output and the model requests the agent made.
# Its tools are written out here, not shared with the other SDK agents'
# scripts: a launch script is the whole agent, and its SHA-256 (in bundles,
# checked by `run --replay`) covers all of it.
site=$(echo "$FORGELOG_BUNDLES"/pydantic-ai/lib/python3*/site-packages)
export PYTHONPATH="$site"
exec python3 -c "$(cat <<'PY'
import json, os, subprocess
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

def bash(command: str) -> str:
    """Runs a shell command in the task's directory; its output and exit status."""
    r = subprocess.run(["bash", "-lc", command], capture_output=True, text=True, timeout=600)
    return f"{(r.stdout + r.stderr)[-20000:]}\n(exit status {r.returncode})"

def read_file(path: str) -> str:
    """The text of a file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()[-50000:]

def write_file(path: str, content: str) -> str:
    """Writes content to a file, replacing it."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
    return f"wrote {len(content)} characters to {path}"

client = AsyncOpenAI(base_url=os.environ["FORGELOG_BASE_URL"] + "/v1",
                     api_key=os.environ["FORGELOG_API_KEY"], max_retries=0)
model = OpenAIChatModel("forgelog", provider=OpenAIProvider(openai_client=client))
agent = Agent(model, tools=[bash, read_file, write_file],
              instructions="You solve tasks in the current directory with your tools. "
                           "When the task is done, say so briefly.")
limit = int(os.environ.get("FORGELOG_MAX_TURNS", "100"))
result = agent.run_sync(open(os.environ["FORGELOG_INSTRUCTION"]).read(),
                        usage_limits=UsageLimits(request_limit=limit))
print(json.dumps({"output": str(result.output), "model_requests": result.usage.requests}))
PY
)"
