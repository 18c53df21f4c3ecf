"""OpenAI Chat Completions through the proxy with the official SDK.
Usage: openai_chat.py BASE_URL API_KEY. Prints {"calls": N}: calls the proxy recorded."""
import json
import sys

import openai
from openai import OpenAI

base, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
calls = 0

# Plain, not streamed.
r = client.chat.completions.create(model="gpt-test", messages=[
    {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}])
calls += 1
assert r.choices[0].message.content == "Echo: Hello there", r
assert r.choices[0].finish_reason == "stop"
assert r.usage.completion_tokens == len("Echo: Hello there")

# Tools, not streamed, then the tool's result.
msgs = [{"role": "user", "content": "Weather in Paris?"}]
r = client.chat.completions.create(model="gpt-test", messages=msgs, tools=TOOLS)
calls += 1
m = r.choices[0].message
assert r.choices[0].finish_reason == "tool_calls", r
assert m.tool_calls[0].function.name == "get_weather"
assert json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris"}
msgs += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "sunny"}]
r = client.chat.completions.create(model="gpt-test", messages=msgs, tools=TOOLS)
calls += 1
assert r.choices[0].message.content.startswith("Echo: Weather in Paris"), r

# Hermes-style tool call text from the engine becomes a structured tool call.
r = client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "[hermes] weather?"}], tools=TOOLS)
calls += 1
assert r.choices[0].message.tool_calls[0].function.name == "get_weather", r
assert r.choices[0].message.content == "Let me check."

# Streamed, with usage.
text, usage = "", None
for chunk in client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "Stream please"}],
                                            stream=True, stream_options={"include_usage": True}):
    if chunk.usage:
        usage = chunk.usage
    for c in chunk.choices:
        text += c.delta.content or ""
calls += 1
assert text == "Echo: Stream please", text
assert usage and usage.completion_tokens == len(text)

# Streamed tool call.
args, name = "", None
for chunk in client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "Weather?"}],
                                            tools=TOOLS, stream=True):
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            name = tc.function.name or name
            args += tc.function.arguments or ""
calls += 1
assert name == "get_weather" and json.loads(args) == {"city": "Paris"}, (name, args)

# Errors in OpenAI's shape.
try:
    client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}], n=2)
    raise AssertionError("n=2 accepted")
except openai.BadRequestError as e:
    assert "n" in e.message
calls += 1  # recorded as a client error
try:
    OpenAI(base_url=f"{base}/v1", api_key="fl-wrong", max_retries=0).chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("wrong key accepted")
except openai.AuthenticationError:
    pass
print(json.dumps({"calls": calls}))
