"""A batch from Python: progress as it runs, Ctrl-C, and a re-run that skips what completed.

    export OPENAI_API_KEY=...       # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    python -m examples.batch_script     # press Ctrl-C mid-way, then run it again

    python -m examples.batch_script --offline   # no key: a fake model server on 127.0.0.1;
                                                # it interrupts itself, then runs again

The jobs are the prompts of ``examples/jobs.jsonl``; the batch and its jobs live in a SQLite
file (``--store``).  Ctrl-C cancels the jobs running now and journals them; running the
script again opens the same batch: completed jobs are skipped, interrupted ones resume from
their journals, the rest run.  (``trio-agents batch`` is the same thing as a command.)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

import trio_agents as ta
from trio_agents.testing import ResponsePlan, open_fake_openai_server, openai_stream

MODEL = os.environ.get("TRIO_AGENTS_MODEL", "gpt-4o-mini")
JOBS_FILE = Path(__file__).with_name("jobs.jsonl")
BATCH_ID = "example-batch"


def make_agent(model: ta.models.Model) -> ta.Agent:
    return ta.Agent(name="summarizer", model=model, instructions="Answer in one sentence.")


def load_jobs() -> list[ta.Job]:
    lines = JOBS_FILE.read_text().splitlines()
    return [ta.Job(**json.loads(line)) for line in lines if line.strip()]


async def cancel_on_ctrl_c(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            print("Ctrl-C: cancelling the running jobs (journaled; run again to finish)")
            scope.cancel()
            return


async def run_batch(runner: ta.Runner, agent: ta.Agent, *, stop_after: int | None) -> None:
    """Open the batch (new, or again to finish it), follow it; stop early on Ctrl-C, or
    once ``stop_after`` jobs completed."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_ctrl_c, scope)
            async with runner.open_batch(agent, batch_id=BATCH_ID, concurrency=2) as batch:
                new = await batch.submit_many(load_jobs())  # a job the batch has is skipped
                print(f"{new} new jobs")
                seen, shown = 0, ""
                while True:
                    progress = await batch.refresh()
                    for job in await batch.finished(after=seen):
                        seen = job.finished_seq
                        print(f"  {job.status}: {job.key}: {job.outcome['output']}")
                    line = (
                        f"{progress.completed}/{progress.total} completed, "
                        f"{progress.running} running, {progress.queued} queued"
                    )
                    if line != shown:
                        print(line)
                        shown = line
                    if progress.done:
                        break
                    if stop_after is not None and progress.completed >= stop_after:
                        print("stopping early, as Ctrl-C would")
                        scope.cancel()
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()  # done: stop listening for Ctrl-C


ASKED: collections.Counter[str] = collections.Counter()  # offline: requests per prompt


def fake_model(body: Any) -> ResponsePlan:
    """Offline: a short answer per prompt, streamed over a quarter of a second."""
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    ASKED[prompt] += 1
    return openai_stream([f"An answer to {prompt!r}", "."], delay=0.25)


@asynccontextmanager
async def open_model(offline: bool) -> AsyncIterator[ta.models.Model]:
    """The real endpoint (OPENAI_API_KEY / OPENAI_BASE_URL), or a fake one on 127.0.0.1."""
    if not offline:
        yield ta.models.OpenAIChat(MODEL)
        return
    async with open_fake_openai_server(responder=fake_model) as server:
        yield ta.models.OpenAIChat(MODEL, base_url=server.base_url, api_key="offline")


async def main(store: str, *, offline: bool) -> None:
    async with open_model(offline) as model:
        agent = make_agent(model)
        async with ta.Runner(store=store) as runner:
            await run_batch(runner, agent, stop_after=2 if offline else None)
        if offline:
            print("--- the same batch again, as a new process would ---")
            async with ta.Runner(store=store) as runner:
                await run_batch(runner, agent, stop_after=None)
            asked = {job.key: ASKED[job.prompt] for job in load_jobs()}
            print(f"model requests per job: {json.dumps(asked)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run a batch; Ctrl-C and run it again.")
    parser.add_argument("--offline", action="store_true", help="use a fake model server")
    parser.add_argument("--store", default="sqlite:///.trio_agents/batch_script.db")
    args = parser.parse_args()
    if args.store.startswith("sqlite:///"):
        Path(args.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    trio.run(partial(main, args.store, offline=args.offline))
