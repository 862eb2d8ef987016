"""`trio-agents batch`, run as a real subprocess against the fake OpenAI server."""

from __future__ import annotations

import io
import json
import os
import random
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from rich.console import Console

import trio_agents as ta
from trio_agents.cli._batch import run_batch
from trio_agents.cli._jobs_file import OutcomesBusy, open_outcomes
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import FinishedJob, MemoryStore, SQLiteStore
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
    """Ctrl-C mid-batch: exit 130 with the jobs journaled, saying how many it cancelled (as
    many as the store has cancelled, or a few more put back before they started), the bar's
    last counts those of the summary; the same command again: exit 0, and the outcomes file
    holds each job exactly once, as the store does."""
    n = 120
    jobs = write_jobs(tmp_path / "jobs.jsonl", prompts(n))
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    argv = [*command(), "batch", str(jobs), "--agent", AGENT, "--store", store]
    argv += ["--concurrency", "16", "--batch-id", "night"]
    async with open_fake_openai_server(responder=slow_answer) as server:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                first = await launch(nursery, "first", argv, server, tmp_path)
                await server.wait_until(lambda: len(server.requests) >= 40)
                first.process.send_signal(signal.SIGINT)
            assert first.status == 130, first.output
            # It says what it stopped, as the store has it; its bar agrees with its summary.
            async with SQLiteStore(tmp_path / "agents.db") as s:
                counts = (await s.get_batch("night")).counts
            assert counts["cancelled"] > 0
            assert counts["running"] == 0
            # What else the stop found may stand between: claims not started yet (back in
            # the queue), jobs that ended meanwhile; never an ending it could not store.
            said = re.findall(
                r"interrupted: (\d+) job\(s\) running here were cancelled and journaled, for "
                r"the next run to resume(?:; \d+ claimed but not started went back to the queue)?"
                r"(?:; meanwhile [a-z0-9, ]+)?; run the same command again to resume batch "
                r"night\n",
                first.output,
            )
            assert len(said) == 1, first.output
            [stopped] = said
            assert counts["cancelled"] <= int(stopped) <= 16  # (and some were put back)
            line = bar_line(first.output, n)
            assert f"completed {counts['completed']} " in line, first.output
            assert f"cancelled {counts['cancelled']} " in line, first.output
            assert "running" not in line
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


def bar_line(out: str, total: int) -> str:
    """The progress bar's last drawing: the line with ``total/total`` (or ``n/total``)."""
    [line] = [line for line in out.splitlines() if f"/{total} " in line]
    return line


async def test_the_last_progress_line_tells_the_final_counts(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """The bar's last drawing shows the counts the summary shows.  Four jobs end together
    1.1 s in; the bar last looked at the batch at 1.0 s (every quarter second), when all four
    ran: drawn from that look it would say "4/4 ... running 4" above a summary of 4
    completed."""
    jobs = write_jobs(tmp_path / "jobs.jsonl", prompts(4))
    model = ScriptedModel(lambda request: ScriptedTurn(chunks=("done",), delay=1.1))
    out = io.StringIO()
    status = await run_batch(
        Console(file=out, width=120, highlight=False),
        ta.Agent(name="slow", model=model),
        jobs,
        store=MemoryStore(clock=lambda: 1_700_000_000.0 + trio.current_time()),
        batch_id="b",
        concurrency=4,
        out=tmp_path / "out.jsonl",
        skip_bad=False,
        requeue=["cancelled"],
    )
    text = out.getvalue()
    assert status == 0, text
    assert "│ completed │    4 │" in text  # the summary
    line = bar_line(text, 4)
    assert "4/4 completed 4 " in line, text
    assert "running" not in line, text


def finished(i: int) -> FinishedJob:
    outcome = {"status": "completed", "output": f"answer {i}"}
    return FinishedJob(
        batch_id="b",
        key=f"k{i}",
        invocation_id=f"inv-{i}",
        status="completed",
        finished_seq=i + 1,
        metadata={},
        outcome=outcome,
    )


def test_the_outcomes_file_has_one_writer_and_survives_a_cut_line(tmp_path: Path) -> None:
    """While the file is open for writing, opening it again (another open file, as another
    process would) is refused naming this pid and the batch; once closed, its lock file is
    gone and it opens again.  A last line cut off by a crash is dropped on opening, and its
    job's line is written again whole, once."""
    path = tmp_path / "out.jsonl"
    with open_outcomes(path, batch_id="b") as outcomes:
        assert outcomes.append([finished(0), finished(1)]) == 2
        with pytest.raises(OutcomesBusy) as refused, open_outcomes(path, batch_id="other"):
            pass
        assert f"(pid {os.getpid()} on " in str(refused.value)
        assert ", batch b, since " in str(refused.value)
    assert not path.with_name("out.jsonl.lock").exists()
    first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first + second[:20])  # a crash while the second line was written
    with open_outcomes(path, batch_id="b") as outcomes:
        assert path.read_bytes() == first
        assert outcomes.append([finished(i) for i in range(3)]) == 2
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [line["key"] for line in lines] == ["k0", "k1", "k2"]


# ---- one writer per outcomes file -----------------------------------------------------------
# These run the agent of tests/batch_agents.py: its model requests name the process that sent
# them (``x-worker``), and its tool appends each call's idempotency key to an effects file.

PAYER = "tests.batch_agents:agent"


@attrs.define
class Payer:
    """The payer's model: a call of ``charge``, then an answer naming the job (``size`` long,
    so that an outcome line takes several writes), each piece ``delay`` seconds after the
    last.  While ``hold`` is on, each turn takes a third of a second or more: the batch is
    still running while the test starts more processes."""

    hold: bool = False
    size: int = 100
    delay: float = 0.005

    def __call__(self, body: Any) -> ResponsePlan:
        delay = 0.1 if self.hold else self.delay
        job = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if not any(m["role"] == "tool" for m in body["messages"]):
            call = ToolCall(id="c1", name="charge", arguments=json.dumps({"job": job}))
            return openai_stream(tool_calls=[call], delay=delay)
        return openai_stream([f"{job} paid ", "x" * self.size], delay=delay)


@attrs.define
class Run:
    """One ``trio-agents batch`` process, and what it printed once it exited."""

    name: str
    process: trio.Process = attrs.field(init=False)
    done: subprocess.CompletedProcess[bytes] | None = None
    exited: trio.Event = attrs.field(factory=trio.Event)

    @property
    def status(self) -> int | None:
        return None if self.done is None else self.done.returncode

    @property
    def output(self) -> str:
        assert self.done is not None
        return self.done.stdout.decode() + self.done.stderr.decode()


async def launch(
    nursery: trio.Nursery, name: str, argv: list[str], server: FakeServer, tmp_path: Path
) -> Run:
    """Start ``argv`` as the process ``name`` (what its model requests say in ``x-worker``)."""
    env = {
        **env_for(server),
        "TRIO_AGENTS_TEST_MODEL_URL": server.base_url,
        "TRIO_AGENTS_TEST_WORKER": name,
        "TRIO_AGENTS_TEST_EFFECTS": str(tmp_path / "effects.txt"),
    }
    run = Run(name)

    async def go(task_status: trio.TaskStatus[trio.Process]) -> None:
        run.done = await trio.run_process(
            argv,
            cwd=ROOT,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            task_status=task_status,
        )
        run.exited.set()

    run.process = await nursery.start(go)
    return run


def asked(server: FakeServer, name: str) -> bool:
    return any(r.headers.get("x-worker") == name for r in server.requests)


def each_job_once(path: Path, n: int) -> list[dict[str, Any]]:
    """The outcome lines of ``path``: each a whole JSON line, one per job ``k0``..``k{n-1}``."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), raw[-200:]
    lines = [json.loads(line) for line in raw.splitlines()]
    assert sorted(line["key"] for line in lines) == sorted(f"k{i}" for i in range(n))
    assert {line["status"] for line in lines} == {"completed"}
    return lines


def no_effect_twice(tmp_path: Path, n: int) -> None:
    effects = (tmp_path / "effects.txt").read_text().splitlines()
    assert len(effects) == len(set(effects)) == n


def no_lock_left(tmp_path: Path) -> None:
    assert not list(tmp_path.glob("*.lock"))


def cut_line(path: Path) -> bool:
    """Whether the file's last line was cut off (a writer died writing it)."""
    return not path.read_bytes().endswith(b"\n")


@pytest.mark.slow
@pytest.mark.postgres
async def test_runs_of_a_batch_on_postgres_each_write_their_file_and_never_the_same_one(
    tmp_path: Path, postgres_url: str, postgres_schema: str
) -> None:
    """Three runs of one batch on one PostgreSQL store start together: two give the same
    outcomes file, one its own (another machine).  Of the two, one is refused at once (exit
    75, naming the other's pid) and asks the model nothing; the other and the third share
    the jobs, and each of their files holds every job once.  The lock files are gone
    afterwards.  The last progress line of each agrees with its summary."""
    n = 40
    jobs = write_jobs(tmp_path / "jobs.jsonl", prompts(n))
    store = f"{postgres_url}?schema={postgres_schema}"
    mine, theirs = tmp_path / "a.jsonl", tmp_path / "b.jsonl"

    def argv(out: Path) -> list[str]:
        return [*command(), "batch", str(jobs), "--agent", PAYER, "--store", store,
                "--batch-id", "shared", "--concurrency", "4", "--out", str(out)]  # fmt: skip

    payer = Payer(hold=True)
    async with open_fake_openai_server(responder=payer) as server:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                same = [await launch(nursery, name, argv(mine), server, tmp_path) for name in "ac"]
                other = await launch(nursery, "b", argv(theirs), server, tmp_path)
                # Held back until one of the two was refused and the third runs jobs.
                await server.wait_until(
                    lambda: any(r.status is not None for r in same) and asked(server, "b")
                )
                payer.hold = False
    assert sorted(r.status or 0 for r in same) == [0, 75], [r.output for r in same]
    [refused] = [r for r in same if r.status == 75]
    [writer] = [r for r in same if r is not refused]
    assert f"{str(mine)!r} is being written by another trio-agents batch (pid " in refused.output
    assert f"(pid {writer.process.pid} on " in refused.output
    assert "batch shared" in refused.output
    assert "new job(s)" not in refused.output
    assert not asked(server, refused.name)
    assert (writer.status, other.status) == (0, 0), (writer.output, other.output)
    each_job_once(mine, n)
    each_job_once(theirs, n)
    no_lock_left(tmp_path)
    no_effect_twice(tmp_path, n)
    for run in (writer, other):
        assert f"/{n} completed {n} " in bar_line(run.output, n), run.output


@pytest.mark.slow
async def test_writers_racing_and_killed_leave_each_job_once_in_the_file(tmp_path: Path) -> None:
    """Two runs of one command (same SQLite store, same outcomes file) start together; the one
    that does not get the file is refused (exit 75), the other is SIGKILLed at a random moment
    of its run (the seed is printed); the same command once more then completes the batch.
    The file holds each job exactly once, every line whole, as the store has them, and no tool
    call ran twice."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    n = 40
    jobs = write_jobs(tmp_path / "jobs.jsonl", prompts(n))
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    outcomes = tmp_path / "jobs.outcomes.jsonl"
    argv = [*command(), "batch", str(jobs), "--agent", PAYER, "--store", store]
    argv += ["--batch-id", "raced", "--concurrency", "4", "--lease-ttl", "1"]
    payer = Payer(size=20_000, delay=0.05)  # the batch takes about 3 s
    async with open_fake_openai_server(responder=payer) as server:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                runs = [await launch(nursery, name, argv, server, tmp_path) for name in "wv"]
                # The loser exits at once; both running jobs would be the bug (each writing).
                await server.wait_until(
                    lambda: (
                        any(r.process.returncode is not None for r in runs)
                        or all(asked(server, r.name) for r in runs)
                    )
                )
                moment = rng.uniform(0.3, 1.5)
                await trio.sleep(moment)
                for run in runs:
                    if run.process.returncode is None:
                        run.process.kill()
            payer.delay = 0.005  # the rest, quickly
            refused = [r for r in runs if r.status == 75]
            killed = [r for r in runs if r.status == -signal.SIGKILL]
            print(f"seed {seed}: killed {moment:.2f} s in; cut line: {cut_line(outcomes)}")
            assert (len(refused), len(killed)) == (1, 1), [r.output for r in runs]
            assert f"(pid {killed[0].process.pid} on " in refused[0].output
            async with trio.open_nursery() as nursery:
                again = await launch(nursery, "again", argv, server, tmp_path)
    assert again.status == 0, again.output
    lines = each_job_once(outcomes, n)
    async with SQLiteStore(tmp_path / "agents.db") as s:
        finished = await s.finished_jobs("raced", limit=2 * n)
    assert sorted((f.key, f.invocation_id) for f in finished) == sorted(
        (line["key"], line["invocation_id"]) for line in lines
    )
    no_effect_twice(tmp_path, n)
    no_lock_left(tmp_path)
