# An agent on the OpenAI Agents SDK (`openai-agents`), through the Responses
# API on the proxy: the SDK's own loop (Runner) with three tools of ours:
# bash, read_file, write_file. The SDK is a library, so the agent is this
# script; its tracing (an upload to OpenAI) is off. The bundle is a venv whose
# site-packages run on the sandbox's python3 (the same minor version). Prints
# one JSON line: the final output and the model calls the SDK made.
# Its tools are written out here, not shared with the other SDK agents'
# scripts: a launch script is the whole agent, and its SHA-256 (in bundles,
# checked by `run --replay`) covers all of it.
site=$(echo "$FORGELOG_BUNDLES"/openai-agents/lib/python3*/site-packages)
export PYTHONPATH="$site" OPENAI_AGENTS_DISABLE_TRACING=1
exec python3 -c "$(cat <<'PY'
import json, os, subprocess, sys
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

@function_tool
def bash(command: str) -> str:
    """Runs a shell command in the task's directory; its output and exit status."""
    r = subprocess.run(["bash", "-lc", command], capture_output=True, text=True, timeout=600)
    return f"{(r.stdout + r.stderr)[-20000:]}\n(exit status {r.returncode})"

@function_tool
def read_file(path: str) -> str:
    """The text of a file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()[-50000:]

@function_tool
def write_file(path: str, content: str) -> str:
    """Writes content to a file, replacing it."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
    return f"wrote {len(content)} characters to {path}"

set_tracing_disabled(True)
client = AsyncOpenAI(base_url=os.environ["FORGELOG_BASE_URL"] + "/v1",
                     api_key=os.environ["FORGELOG_API_KEY"], max_retries=0)
agent = Agent(
    name="forgelog-agent",
    instructions="You solve tasks in the current directory with your tools. "
                 "When the task is done, say so briefly.",
    tools=[bash, read_file, write_file],
    model=OpenAIResponsesModel(model="forgelog", openai_client=client),
)
task = open(os.environ["FORGELOG_INSTRUCTION"]).read()
result = Runner.run_sync(agent, task, max_turns=int(os.environ.get("FORGELOG_MAX_TURNS", "100")))
print(json.dumps({"final_output": str(result.final_output),
                  "model_calls": len(result.raw_responses)}))
PY
)"
