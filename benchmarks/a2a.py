"""A2A ``CancelTask`` latency: from the request to its answer (the final ``canceled`` task), and
to the moment the model server saw the model stream close, next to our native cancel endpoint.

The server is the real command (``trio-agents serve``, SQLite store) in a process of its own;
the model is the fake server in another (``python -m trio_agents.testing``, 100 tokens/s); the
client is httpx2 here.  Each round streams a task (``SendStreamingMessage``) until five text
deltas came, then cancels it (``CancelTask``), then reads its stream to the end; rounds of the
native endpoint (``POST /invocations/{id}:cancel`` on a ``/run_sse`` stream) alternate with
them.  Times are ``time.monotonic()`` in both processes (one clock for the machine).  With
``--pg URL``: also a cancel sent to a second instance for a task running on the first, both
on that PostgreSQL.

Run: ``python -m benchmarks.a2a`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from typing import Any

import httpx2
import trio

from benchmarks._common import machine, percentiles, server_process
from benchmarks.cancel_latency import Records, new_tag
from benchmarks.server import TOKEN, cancel_by_endpoint, ours


def rpc_body(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}


async def a2a_cancel(
    client: httpx2.AsyncClient, url: str, cancel_url: str
) -> tuple[str, float, float]:
    """One round: stream a task until 5 deltas, cancel it; (tag, cancelled at, answer ms)."""
    tag = new_tag("a2a")
    params = {
        "message": {"messageId": tag, "role": "ROLE_USER", "parts": [{"text": tag}]},
        "metadata": {"skill": "cancel"},
    }
    body = rpc_body("SendStreamingMessage", params)
    async with client.stream("POST", f"{url}/a2a", json=body) as response:
        lines = response.aiter_lines()
        task_id, deltas = "", 0
        async for line in lines:
            if not line.startswith("data:"):
                continue
            result = json.loads(line[5:])["result"]
            task_id = task_id or result.get("task", {}).get("id", "")
            deltas += "artifactUpdate" in result
            if deltas == 5:
                break
        at = time.monotonic()
        answer = await client.post(
            f"{cancel_url}/a2a", json=rpc_body("CancelTask", {"id": task_id})
        )
        answered = time.monotonic()
        state = answer.json().get("result", {}).get("status", {}).get("state")
        if state != "TASK_STATE_CANCELED":
            raise RuntimeError(f"CancelTask answered {answer.status_code}: {answer.text[:300]}")
        async for _ in lines:  # to the final status update
            pass
    return tag, at, (answered - at) * 1000


async def measure(model_url: str, url: str, cancel_url: str, rounds: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
    async with httpx2.AsyncClient(timeout=120, headers=headers) as client:
        records = Records(client, model_url)
        for _ in range(3):  # warm-up, discarded
            await a2a_cancel(client, url, cancel_url)
            await cancel_by_endpoint(client, url, cancel_url)
        a2a, native, answers, native_answers = [], [], [], []
        for _ in range(rounds):
            tag, at, ms = await a2a_cancel(client, url, cancel_url)
            a2a.append((tag, at))
            answers.append(ms)
            tag, at, ms = await cancel_by_endpoint(client, url, cancel_url)
            native.append((tag, at))
            native_answers.append(ms)
        return {
            "answer": percentiles(answers),
            "model": percentiles(await records.disconnect_ms(a2a)),
            "native answer": percentiles(native_answers),
            "native model": percentiles(await records.disconnect_ms(native)),
        }


def line(name: str, r: dict[str, Any], rounds: int) -> str:
    a, m = r["answer"], r["model"]
    na, nm = r["native answer"], r["native model"]
    return (
        f"{name}: CancelTask answer p50 {a['p50']:.1f} p99 {a['p99']:.1f} ms, model stream "
        f"closed p50 {m['p50']:.1f} p99 {m['p99']:.1f} ms | native :cancel answer p50 "
        f"{na['p50']:.1f} p99 {na['p99']:.1f} ms, model p50 {nm['p50']:.1f} p99 {nm['p99']:.1f}"
        f" ms ({rounds} cancels each)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--pg", metavar="URL", help="also cancel across two instances on it")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    print(f"# benchmarks.a2a on {machine()}")
    with tempfile.TemporaryDirectory() as tmp, server_process() as model_url:
        with ours(model_url, f"sqlite:///{tmp}/a2a.db") as (url, _):
            found = trio.run(measure, model_url, url, url, args.rounds)
        print(line("one instance, SQLite", found, args.rounds))
        if args.pg:
            schema = f"bench_{uuid.uuid4().hex[:12]}"
            store = f"{args.pg}?schema={schema}"
            try:
                with ours(model_url, store) as (a, _), ours(model_url, store) as (b, _):
                    found = trio.run(measure, model_url, a, b, args.rounds)
                print(line("from another instance, PostgreSQL", found, args.rounds))
            finally:
                import psycopg

                with psycopg.connect(args.pg, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
