"""`trio-agents batch`, run as a real subprocess against the fake OpenAI server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_agents.stores import SQLiteStore
from trio_agents.testing import FakeServer, ResponsePlan, open_fake_openai_server, openai_stream

from .test_cli import ROOT, command

AGENT = "examples.summarize:agent"


def slow_answer(body: Any) -> ResponsePlan:
    return openai_stream(["one ", "short ", "answer."], delay=0.05)


def env_for(server: FakeServer) -> dict[str, str]:
    return {
        **os.environ,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": server.base_url,
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "120",
    }


def write_jobs(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def prompts(n: int) -> list[str]:
    return [json.dumps({"prompt": f"job {i}", "key": f"k{i}"}) for i in range(n)]


async def batch(
    server: FakeServer, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[bytes]:
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    with trio.fail_after(60):
        return await trio.run_process(
            [*command(), "batch", *args, "--store", store],
            cwd=tmp_path,
            env=env_for(server),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


@pytest.mark.slow
async def test_bad_input_is_named_and_nothing_runs(tmp_path: Path) -> None:
    """An empty file, a malformed line, a job without a prompt, an unknown agent, a batch id
    reused with another agent: exit 2, one line that says what is wrong."""
    async with open_fake_openai_server(responder=slow_answer) as server:
        empty = write_jobs(tmp_path / "empty.jsonl", [])
        done = await batch(server, tmp_path, str(empty), "--agent", AGENT)
        assert done.returncode == 2
        assert b"is empty: one JSON job per line" in done.stderr

        bad = write_jobs(
            tmp_path / "bad.jsonl",
            [prompts(1)[0], '{"prompt": "x"', '{"text": "no prompt"}', '{"metadata": {}}'],
        )
        done = await batch(server, tmp_path, str(bad), "--agent", AGENT)
        out = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 2, out
        assert "bad.jsonl: line 2: not JSON" in out
        assert "bad.jsonl: line 3: unknown field(s) 'text'" in out
        assert "bad.jsonl: line 4: the job has no prompt" in out
        assert "3 line(s) of" in out
        assert "pass --skip-bad to run the others" in out
        assert "Traceback" not in out
        assert server.requests == []  # refused before anything ran

        done = await batch(server, tmp_path, str(bad), "--agent", AGENT, "--skip-bad")
        assert done.returncode == 0, done.stdout.decode()
        assert len(server.requests) == 1

        good = write_jobs(tmp_path / "good.jsonl", prompts(2))
        done = await batch(server, tmp_path, str(good), "--agent", "examples.summarize:nope")
        assert (done.returncode, b"has no attribute 'nope'" in done.stderr) == (2, True)
        weather = ("--agent", "examples.weather:agent", "--batch-id", "shared")
        done = await batch(server, tmp_path, str(good), *weather)
        assert done.returncode == 0, done.stdout.decode()
        done = await batch(server, tmp_path, str(good), "--agent", AGENT, "--batch-id", "shared")
        assert done.returncode == 2
        assert b"was created for agent 'weather', not 'summarizer'" in done.stderr
        done = await trio.run_process(
            [*command(), "batch", "cancel", "nope", "--store", f"sqlite:///{tmp_path}/agents.db"],
            cwd=tmp_path,
            capture_stderr=True,
            check=False,
        )
        assert (done.returncode, b"no batch with id 'nope'" in done.stderr) == (2, True)


@pytest.mark.slow
async def test_ctrl_c_then_a_rerun_writes_every_outcome_once(tmp_path: Path) -> None:
    """Ctrl-C mid-batch: exit 130 with the jobs journaled; the same command again: exit 0,
    and the outcomes file holds each job exactly once, as the store does."""
    n = 120
    jobs = write_jobs(tmp_path / "jobs.jsonl", prompts(n))
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    argv = [*command(), "batch", str(jobs), "--agent", AGENT, "--store", store]
    argv += ["--concurrency", "16", "--batch-id", "night"]
    async with open_fake_openai_server(responder=slow_answer) as server:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                run = partial(
                    trio.run_process,
                    argv,
                    cwd=tmp_path,
                    env=env_for(server),
                    capture_stdout=True,
                    check=False,
                )
                proc: trio.Process = await nursery.start(run)
                await server.wait_until(lambda: len(server.requests) >= 40)
                proc.send_signal(signal.SIGINT)
            assert proc.returncode == 130
            outcomes = tmp_path / "jobs.outcomes.jsonl"
            first_lines = outcomes.read_text().splitlines()
            assert 0 < len(first_lines) < n
            done = await trio.run_process(
                argv, cwd=tmp_path, env=env_for(server), capture_stdout=True, check=False
            )
    out = done.stdout.decode()
    assert done.returncode == 0, out
    assert f"completed │  {n}" in out
    lines = [json.loads(line) for line in outcomes.read_text().splitlines()]
    assert lines[: len(first_lines)] == [json.loads(line) for line in first_lines]  # appended
    assert sorted(line["key"] for line in lines) == sorted(f"k{i}" for i in range(n))
    assert {line["status"] for line in lines} == {"completed"}
    assert {line["output"] for line in lines} == {"one short answer."}
    async with SQLiteStore(tmp_path / "agents.db") as s:
        finished = await s.finished_jobs("night", limit=2 * n)
    assert {(f.key, f.invocation_id) for f in finished} == {
        (line["key"], line["invocation_id"]) for line in lines
    }
