"""The official SDKs (and raw HTTP for Gemini) through the proxy to the real engine (SmolLM2, greedy).
Usage: engine_sdks.py BASE_URL API_KEY. Prints {"calls": N}.

The model decides what it says, so this checks shapes and consistency: every
answer is well-formed in its dialect, a streamed call says exactly what the same
call not streamed said (greedy decoding), and tool definitions, tool calls and
tool results in the history are accepted in each dialect."""
import json
import sys
import urllib.request

from anthropic import Anthropic
from openai import OpenAI

base, key = sys.argv[1], sys.argv[2]
oai = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
ant = Anthropic(base_url=base, api_key=key, max_retries=0)
QUESTION = "What is the capital of France?"
calls = 0

# OpenAI Chat Completions: plain, then the same call streamed with usage.
chat = dict(model="smollm2", temperature=0, max_tokens=12,
            messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}])
r = oai.chat.completions.create(**chat)
calls += 1
said = r.choices[0].message.content
assert said and r.choices[0].finish_reason in ("stop", "length"), r
assert 1 <= r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 10, r.usage
text, usage = "", None
for chunk in oai.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True}):
    usage = chunk.usage or usage
    for c in chunk.choices:
        text += c.delta.content or ""
calls += 1
assert text == said, (text, said)
assert usage.completion_tokens == r.usage.completion_tokens, usage

# A tool-using history: the model's call, the tool's result, the next turn.
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
history = [{"role": "user", "content": "What is the weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
r = oai.chat.completions.create(model="smollm2", temperature=0, max_tokens=12, messages=history, tools=TOOLS)
calls += 1
m = r.choices[0].message
assert m.content or m.tool_calls, r

# OpenAI Responses: create, then the SDK's stream helper on the same input.
resp = dict(model="smollm2", temperature=0, max_output_tokens=12, instructions="Answer briefly.", input=QUESTION)
r = oai.responses.create(**resp)
calls += 1
assert r.status in ("completed", "incomplete") and r.output_text, r
with oai.responses.stream(**resp) as s:
    events = list(s)
    # The helper's final response exists for completed responses only (as with OpenAI's own).
    final = s.get_final_response().output_text if r.status == "completed" else None
calls += 1
kinds = [e.type for e in events]
assert kinds[0] == "response.created" and kinds[-1] == f"response.{r.status}", (kinds, r.status)
streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert streamed == r.output_text and final in (None, streamed), (streamed, final, r.output_text)
r = oai.responses.create(model="smollm2", temperature=0, max_output_tokens=12, tools=[
    {"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}], input=[
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}])
calls += 1
assert r.output, r

# Anthropic Messages: create, then stream the same call; a tool_use history.
# (This SDK release has no `temperature` argument; the API still takes the field.)
msg = dict(model="smollm2", extra_body={"temperature": 0}, max_tokens=12, system="Answer briefly.",
           messages=[{"role": "user", "content": QUESTION}])
r = ant.messages.create(**msg)
calls += 1
assert r.stop_reason in ("end_turn", "max_tokens") and r.content[0].type == "text", r
with ant.messages.stream(**msg) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
calls += 1
assert text == r.content[0].text, (text, r.content[0].text)
assert final.usage.output_tokens == r.usage.output_tokens, final.usage
r = ant.messages.create(model="smollm2", extra_body={"temperature": 0}, max_tokens=12, tools=[
    {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}], messages=[
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]}])
calls += 1
assert r.content, r
# Gemini over raw HTTP (no SDK here): generateContent, then the same streamed as SSE.
def gemini(action, query=""):
    body = {"systemInstruction": {"parts": [{"text": "Answer briefly."}]},
            "contents": [{"role": "user", "parts": [{"text": QUESTION}]}],
            "generationConfig": {"temperature": 0, "maxOutputTokens": 12}}
    req = urllib.request.Request(f"{base}/v1beta/models/smollm2:{action}{query}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "x-goog-api-key": key})
    with urllib.request.urlopen(req) as r:
        return r.headers.get("content-type"), r.read().decode()

_, raw = gemini("generateContent")
calls += 1
r = json.loads(raw)
said = "".join(p.get("text", "") for p in r["candidates"][0]["content"]["parts"])
assert said and r["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS"), r
kind, raw = gemini("streamGenerateContent", "?alt=sse")
calls += 1
assert kind.startswith("text/event-stream"), kind
chunks = [json.loads(line[len("data: "):]) for line in raw.splitlines() if line.startswith("data: ")]
streamed = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])
assert streamed == said, (streamed, said)
print(json.dumps({"calls": calls}))
