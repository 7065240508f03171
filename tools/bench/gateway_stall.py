"""Bench: how long one large request stalls the gateway's event loop (rewards review #8).

The gateway serves on its rollout worker's event loop, which every other session, the engine
routers and Ray calls of that worker share. A 10 ms ticker runs on that loop while the gateway
answers one request over real HTTP (sent from another process), with a real tokenizer (the tiny
model's; SmolLM2's too without --quick) and max_model_len 2048: a 5 MiB user message, which
cannot fit; and (without --quick) a message just under the gateway's characters bound (the most
text it renders: max_token_chars x 2048), which it renders, tokenizes and then refuses by its
token count. Both are refused (400), so no engine is needed. Reported: the ticker's worst delay
past its 10 ms while the request was answered, and with no request (the machine's own noise).
Goal: < 100 ms for the 5 MiB request. The review measured 15.4 s (SmolLM2, a loaded box).

    python -m tools.bench.gateway_stall [--quick]   # --quick: the tiny tokenizer, the 5 MiB request
    PYTHONPATH=<an older checkout> python tools/bench/gateway_stall.py   # the same against other code

(by path, as the second line: `-m` would put this checkout's rollout/ first on sys.path; this bench
imports nothing of tools/.)

The last line is one JSON object (`code`: the gateway module measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from asyncio.subprocess import PIPE

from rollout.agents.chat_format import ChatFormat
from rollout.agents.client import Agent, TraceRecorder
from rollout.config import SamplingConfig
from rollout.gateway import server as gateway_module
from rollout.gateway.server import Gateway
from rollout.log import setup_logging
from rollout.models import build_smollm2, build_tiny_model

CONTEXT = 2048  # max_model_len: the default (conf: model.max_model_len)
TICK_S = 0.01
GOAL_MS = 100.0


async def worst_delay_ms(work) -> tuple[float, object]:
    """Run `work` (a coroutine) while a 10 ms ticker runs on this loop: the ticker's worst delay
    past its 10 ms, in ms, and what `work` returned."""
    loop = asyncio.get_running_loop()
    done, delays = asyncio.Event(), []

    async def ticker():
        while not done.is_set():
            t0 = loop.time()
            await asyncio.sleep(TICK_S)
            delays.append(loop.time() - t0 - TICK_S)

    tick = asyncio.ensure_future(ticker())
    try:
        result = await work
    finally:
        done.set()
        await tick
    return round(max(delays, default=0.0) * 1000, 1), result


# The client: its own process (a client thread in this one would hold the GIL while it builds and
# sends 5 MiB, and be measured as the gateway's stall). It builds the body, waits for a line on stdin,
# sends it and prints [status, error code, seconds to the answer].
CLIENT = """
import json, sys, time, httpx
url, key, chars = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 8}).encode()
sys.stdin.readline()
t0 = time.perf_counter()
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
r = httpx.post(url, content=body, headers=headers, timeout=600)
print(json.dumps([r.status_code, str((r.json().get("error") or {}).get("code")), time.perf_counter() - t0]))
"""


async def post(url: str, key: str, chars: int) -> tuple[float, int, str, float]:
    """A request with a user message of `chars` characters, over HTTP from a client process: the
    loop's worst stall from its go signal to its answer, its status, error code and seconds."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, url, key, str(chars), stdin=PIPE, stdout=PIPE
    )
    await asyncio.sleep(1.0 + chars / 2**22)  # the client builds its body (not measured: before the go)

    async def go():
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        return json.loads(await proc.stdout.read())

    stall_ms, (status, code, answer_s) = await worst_delay_ms(go())
    await proc.wait()
    return stall_ms, status, code, answer_s


async def measure(name: str, path, cases: dict[str, int]) -> dict:
    """For each case (a user message of that many characters), the loop's worst stall while the
    gateway answers it, and the idle loop's over as long."""
    fmt = ChatFormat.from_pretrained(str(path))
    agent = Agent("solver", "main", None, fmt, TraceRecorder(name), SamplingConfig(), max_model_len=CONTEXT)
    gateway = Gateway()
    await gateway.start()
    out = {}
    try:
        with gateway.session({"solver": agent}) as session:
            url = f"{session.base_url('solver')}/chat/completions"
            for case, chars in {"warm_up": 20_000, **cases}.items():
                stall_ms, status, code, answer_s = await post(url, session.api_key, chars)
                idle_ms, _ = await worst_delay_ms(asyncio.sleep(max(answer_s, 0.5)))
                row = {"chars": chars, "status": status, "code": code, "answer_s": round(answer_s, 3)}
                out[case] = {**row, "worst_stall_ms": stall_ms, "idle_worst_ms": idle_ms}
                print(f"{name:>8} {case:>10}: {out[case]}")
    finally:
        await gateway.stop()
    del out["warm_up"]  # the first request also sets the tokenizer up
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny tokenizer and the 5 MiB request only")
    args = parser.parse_args()
    models = {"tiny": build_tiny_model()} if args.quick else {"tiny": build_tiny_model(), "smollm2": build_smollm2()}
    result = {}
    for name, path in models.items():
        cases = {"5MiB": 5 * 2**20}
        if not args.quick:
            try:  # the most text the gateway renders: what its characters bound lets through
                from rollout.gateway.prompts import max_token_chars

                cases["at_bound"] = max_token_chars(ChatFormat.from_pretrained(str(path))) * CONTEXT - 100
            except ImportError:  # code from before the bound: nothing is refused unrendered
                pass
        result[name] = asyncio.run(measure(name, path, cases))
    worst = max(r["5MiB"]["worst_stall_ms"] for r in result.values())
    print(
        json.dumps(
            {
                "bench": "gateway_stall",
                "quick": args.quick,
                "context": CONTEXT,
                **result,
                "goal_ms": GOAL_MS,
                "goal_met": worst < GOAL_MS,
                "code": gateway_module.__file__,
            }
        )
    )


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
