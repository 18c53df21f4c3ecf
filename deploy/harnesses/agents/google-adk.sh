# An agent on Google's Agent Development Kit (`google-adk`), through the
# Gemini API on the proxy (generateContent, not streamed): ADK's own runner
# and agent loop with three tools of ours (bash, read_file, write_file), its
# Gemini model's base URL the proxy, Vertex AI off. ADK is a library, so the
# agent is this script; it exports no telemetry unless configured, and this
# script configures none. The bundle is a venv whose site-packages run on the
# sandbox's python3 (the same minor version). Prints one JSON line: the final
# text and the model calls the agent made.
# Its tools are written out here, not shared with the other SDK agents'
# scripts: a launch script is the whole agent, and its SHA-256 (in bundles,
# checked by `run --replay`) covers all of it.
site=$(echo "$FORGELOG_BUNDLES"/google-adk/lib/python3*/site-packages)
export PYTHONPATH="$site" GOOGLE_API_KEY="$FORGELOG_API_KEY" GOOGLE_GENAI_USE_VERTEXAI=0
exec python3 -c "$(cat <<'PY'
import json, os, subprocess
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.models.google_llm import Gemini
from google.adk.runners import InMemoryRunner
from google.genai import types

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

calls = 0
def count_call(callback_context, llm_request):
    global calls
    calls += 1

agent = LlmAgent(name="forgelog_agent",
                 model=Gemini(model="forgelog", base_url=os.environ["FORGELOG_BASE_URL"]),
                 instruction="You solve tasks in the current directory with your tools. "
                             "When the task is done, say so briefly.",
                 tools=[bash, read_file, write_file], before_model_callback=count_call)
runner = InMemoryRunner(agent=agent, app_name="forgelog")
session = runner.session_service.create_session_sync(app_name="forgelog", user_id="forgelog")
task = types.Content(role="user", parts=[types.Part(text=open(os.environ["FORGELOG_INSTRUCTION"]).read())])
final = ""
for event in runner.run(user_id="forgelog", session_id=session.id, new_message=task,
                        run_config=RunConfig(max_llm_calls=int(os.environ.get("FORGELOG_MAX_TURNS", "100")))):
    if event.content and event.content.parts:
        final = "".join(p.text or "" for p in event.content.parts) or final
print(json.dumps({"final_output": final, "model_calls": calls}))
PY
)"
