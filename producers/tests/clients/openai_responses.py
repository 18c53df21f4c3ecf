"""OpenAI Responses through the proxy with the official SDK, `responses.stream()` included.
Usage: openai_responses.py BASE_URL API_KEY. Prints {"calls": N}."""
import json
import sys

from openai import OpenAI

base, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
calls = 0

r = client.responses.create(model="gpt-test", instructions="Be terse.", input="Hello there")
calls += 1
assert r.output_text == "Echo: Hello there", r
assert r.status == "completed"

# Text and a tool call: one assistant turn, two output items.
inp = [{"role": "user", "content": "Weather in Paris?"}]
r = client.responses.create(model="gpt-test", input=inp, tools=TOOLS)
calls += 1
assert [o.type for o in r.output] == ["message", "function_call"], r.output
fc = r.output[1]
assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
inp += [o.model_dump(exclude_none=True) for o in r.output]
inp.append({"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"})
r = client.responses.create(model="gpt-test", input=inp, tools=TOOLS)
calls += 1
assert r.output_text.startswith("Echo: Weather in Paris"), r

# The SDK's stream helper accumulates the events into the final response.
with client.responses.stream(model="gpt-test", input="Weather in Rome?", tools=TOOLS) as stream:
    kinds, ids = [], {}
    for event in stream:
        kinds.append(event.type)
        if event.type in ("response.output_item.added", "response.output_item.done"):
            ids.setdefault(event.output_index, set()).add(event.item.id)
    final = stream.get_final_response()
calls += 1
assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
assert all(len(v) == 1 for v in ids.values()), ids
assert [o.type for o in final.output] == ["message", "function_call"], final.output
assert final.output_text == "Calling the tool."
assert json.loads(final.output[1].arguments) == {"city": "Paris"}

# Plain streamed text.
text = ""
for event in client.responses.create(model="gpt-test", input="Stream please", stream=True):
    if event.type == "response.output_text.delta":
        text += event.delta
calls += 1
assert text == "Echo: Stream please", text
print(json.dumps({"calls": calls}))
