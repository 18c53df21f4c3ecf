"""The proxy's load from a Python client, as an operator would measure it.

Runs rounds of N sessions of C calls whose prompts grow turn by turn (the
`openai` SDK, asyncio) against a forgelog proxy already running, and prints
each round's whole-process CPU per call of the proxy (user + system, every
thread, from /proc/PID/stat). The first round warms the proxy up.

    proxy-load fake-upstream --listen 127.0.0.1:18001 &
    proxy-load proxy --upstream http://127.0.0.1:18001 --listen 127.0.0.1:18002 \\
        --admin-token T --spool /tmp/spool &
    ~/.cache/forgelog/venv/bin/python producers/examples/proxy-load-client.py \\
        --proxy http://127.0.0.1:18002 --admin-token T --pid $!
"""

import argparse
import asyncio
import os
import time

import httpx2 as httpx  # what the pinned openai SDK is built on
import openai

WORDS = ["grep", "the", "src/lib.rs", "for", "error", "and", "fix", "tests"]


def task(i: int, tokens: int) -> str:
    """Session i's task: `tokens` bytes of words, as `proxy-load run` writes it."""
    text, w = f"Task {i}: do the thing.", 0
    while len(text) < tokens:
        text += " " + WORDS[(w * 7 + i) % len(WORDS)]
        w += 1
    return text


def cpu_ms(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def session(args, http, name: str, i: int) -> None:
    admin = {"authorization": f"Bearer {args.admin_token}"}
    r = await http.post(
        f"{args.proxy}/sessions",
        headers=admin,
        json={"run_id": args.run_id, "rollout_id": name, "task_id": "load", "harness": "python",
              "group_id": f"g{i // 8}", "group_size": 8},
    )
    if r.status_code != 200:
        raise SystemExit(f"creating a session: {r.status_code} {r.text}")
    created = r.json()
    client = openai.AsyncOpenAI(base_url=f"{args.proxy}/v1", api_key=created["api_key"], http_client=http)
    messages = [{"role": "system", "content": "You are a load test."},
                {"role": "user", "content": task(i, args.prompt_tokens)}]
    for turn in range(args.calls):
        answer = await client.chat.completions.create(model="m", messages=messages, max_tokens=64)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        messages.append({"role": "user", "content": f"turn {turn} done, continue"})
    r = await http.post(f"{args.proxy}/sessions/{created['session_id']}/finish",
                        headers=admin, json={"exit_status": 0})
    r.raise_for_status()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy", required=True, help="the proxy's base URL")
    p.add_argument("--admin-token", required=True)
    p.add_argument("--pid", type=int, required=True, help="the proxy's process id")
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--run-id", default=f"python-load-{os.getpid()}")
    args = p.parse_args()
    limits = httpx.Limits(max_connections=args.sessions * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        for round_no in range(args.rounds):
            cpu0, t0 = cpu_ms(args.pid), time.monotonic()
            await asyncio.gather(*[
                session(args, http, f"python-{os.getpid()}-{round_no}-{i}", i)
                for i in range(args.sessions)
            ])
            calls = args.sessions * args.calls
            print(f"round {round_no}: {calls} calls in {time.monotonic() - t0:.1f} s, "
                  f"proxy CPU {(cpu_ms(args.pid) - cpu0) / calls:.3f} ms/call", flush=True)


asyncio.run(main())
