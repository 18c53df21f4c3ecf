"""Anthropic Messages through the proxy with the official SDK.
Usage: anthropic_messages.py BASE_URL API_KEY. Prints {"calls": N}."""
import json
import sys

import anthropic
from anthropic import Anthropic

base, key = sys.argv[1], sys.argv[2]
client = Anthropic(base_url=base, api_key=key, max_retries=0)
TOOLS = [{"name": "get_weather", "description": "Weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
calls = 0

r = client.messages.create(model="claude-test", max_tokens=256, system="Be terse.",
                           messages=[{"role": "user", "content": "Hello there"}])
calls += 1
assert r.content[0].text == "Echo: Hello there", r
assert r.stop_reason == "end_turn"

msgs = [{"role": "user", "content": "Weather in Paris?"}]
r = client.messages.create(model="claude-test", max_tokens=256, messages=msgs, tools=TOOLS)
calls += 1
assert r.stop_reason == "tool_use", r
assert [b.type for b in r.content] == ["text", "tool_use"], r.content
use = r.content[1]
assert use.name == "get_weather" and use.input == {"city": "Paris"}
msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
r = client.messages.create(model="claude-test", max_tokens=256, messages=msgs, tools=TOOLS)
calls += 1
assert r.content[0].text.startswith("Echo: Weather in Paris"), r

with client.messages.stream(model="claude-test", max_tokens=256, messages=[{"role": "user", "content": "Stream please"}]) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
calls += 1
assert text == "Echo: Stream please", text
assert final.stop_reason == "end_turn" and final.usage.output_tokens == len(text)

with client.messages.stream(model="claude-test", max_tokens=256, messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS) as s:
    final = s.get_final_message()
calls += 1
assert final.stop_reason == "tool_use", final
assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Paris"}, final.content

n = client.messages.count_tokens(model="claude-test", messages=[{"role": "user", "content": "Hello there"}])
assert n.input_tokens > 0, n

try:
    client.messages.create(model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                           extra_body={"temperature": "hot"})
    raise AssertionError("wrong-typed temperature accepted")
except anthropic.BadRequestError as e:
    assert e.body["error"]["type"] == "invalid_request_error", e.body
calls += 1
try:
    Anthropic(base_url=base, api_key="fl-wrong", max_retries=0).messages.create(
        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("wrong key accepted")
except anthropic.AuthenticationError:
    pass
print(json.dumps({"calls": calls}))
