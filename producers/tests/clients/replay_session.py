"""One short agent session with an official SDK, whatever the model answers:
a tool-using first turn (not streamed), a streamed second turn that carries the
tool's result (or a follow-up question), and a third turn not streamed.
Usage: replay_session.py BASE_URL API_KEY openai|anthropic run|diverge [SEED]
run: prints every response (streams as their events) as one JSON line.
diverge: the same first call, then a different tool result / follow-up in the
second (message 3 in OpenAI Chat form, a streamed call): prints
{"status": HTTP status or "in-stream", "error": message} of the refusal."""
import json
import sys

base, key, sdk, mode = sys.argv[1:5]
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
FOLLOW_UP = "And in Rome?" if mode == "run" else "And in Oslo?"
RESULT = "sunny, 21 C" if mode == "run" else "rainy, 9 C"
out = []


def openai_session():
    import openai
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    msgs = [{"role": "system", "content": "You are a weather assistant. Use the get_weather tool."},
            {"role": "user", "content": "What is the weather in Paris?"}]

    def answer_turn(message):
        msgs.append(message)
        if message.get("tool_calls"):
            msgs.extend({"role": "tool", "tool_call_id": c["id"], "content": RESULT} for c in message["tool_calls"])
        else:
            msgs.append({"role": "user", "content": FOLLOW_UP})

    r = client.chat.completions.create(model="smol", messages=msgs, tools=tools, max_tokens=48, temperature=0.7, seed=seed + 1)
    out.append(r.model_dump(mode="json"))
    answer_turn(r.choices[0].message.model_dump(mode="json", exclude_none=True))

    chunks, text, calls = [], "", {}
    try:
        stream = client.chat.completions.create(model="smol", messages=msgs, tools=tools, max_tokens=48, seed=seed + 2,
                                                stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            chunks.append(chunk.model_dump(mode="json"))
            for c in chunk.choices:
                text += c.delta.content or ""
                for tc in c.delta.tool_calls or []:
                    call = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    call["id"] = tc.id or call["id"]
                    call["function"]["name"] += (tc.function.name or "") if tc.function else ""
                    call["function"]["arguments"] += (tc.function.arguments or "") if tc.function else ""
    except openai.APIError as e:  # refused inside the already started stream
        return {"status": getattr(e, "status_code", "in-stream"), "error": e.message}
    out.append(chunks)
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    answer_turn(message)

    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=32, seed=seed + 3)
    out.append(r.model_dump(mode="json"))
    return out


def anthropic_session():
    import anthropic
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    system = "You are a weather assistant. Use the get_weather tool."

    def answer_turn(content):
        blocks = [b.model_dump(mode="json", exclude_none=True) for b in content]
        msgs.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "..."}]})
        uses = [b for b in content if b.type == "tool_use"]
        if uses:
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": RESULT} for u in uses]})
        else:
            msgs.append({"role": "user", "content": FOLLOW_UP})

    r = client.messages.create(model="smol", system=system, messages=msgs, tools=tools, max_tokens=48)
    out.append(r.model_dump(mode="json"))
    answer_turn(r.content)

    try:
        with client.messages.stream(model="smol", system=system, messages=msgs, tools=tools, max_tokens=48) as s:
            events = [e.model_dump(mode="json") for e in s]
            final = s.get_final_message()
    except anthropic.APIError as e:  # refused inside the already started stream
        return {"status": getattr(e, "status_code", "in-stream"), "error": e.message}
    out.append(events)
    answer_turn(final.content)

    r = client.messages.create(model="smol", system=system, messages=msgs, max_tokens=32)
    out.append(r.model_dump(mode="json"))
    return out


result = openai_session() if sdk == "openai" else anthropic_session()
if mode == "diverge" and isinstance(result, list):
    raise SystemExit("the changed second call was answered: " + json.dumps(result)[:2000])
print(json.dumps(result))
