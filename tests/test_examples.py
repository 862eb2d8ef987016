"""The examples, run offline as a user would (``python -m examples.NAME --offline``), each
checked for what it is meant to show, not only for its exit status."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parent.parent


async def run_example(tmp_path: Path, name: str, *args: str) -> str:
    """``python -m examples.NAME ARGS`` in ``tmp_path`` with no model endpoint configured;
    its stdout (it must exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(ROOT)
    env["OPENAI_BASE_URL"] = "http://127.0.0.1:9/nothing-listens-here"  # offline means offline
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", f"examples.{name}", *args],
            cwd=tmp_path,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    return out


@pytest.mark.slow
async def test_research_runs_its_tools_in_parallel(tmp_path: Path) -> None:
    """The three searches of one turn overlap in time: each started before any finished."""
    out = await run_example(tmp_path, "research", "--offline")
    starts = {m[1]: float(m[2]) for m in re.finditer(r"^→ (\w+)\(.*\) at ([\d.]+) s$", out, re.M)}
    ends = {m[1]: float(m[2]) for m in re.finditer(r"^← (\w+): .* at ([\d.]+) s$", out, re.M)}
    names = {"search_web", "search_papers", "search_news"}
    assert set(starts) == set(ends) == names, out
    assert max(starts.values()) < min(ends.values()), out
    for found in ("web: 3 pages", "papers: 2 papers", "news: 1 article"):
        assert found in out
    assert out.rstrip().endswith("[completed]")


@pytest.mark.slow
async def test_deploy_over_http_approved(tmp_path: Path) -> None:
    """Approved over the HTTP route: the tool runs, the gate ends approved."""
    out = await run_example(tmp_path, "deploy_over_http", "--offline")
    assert 'approval requested: deploy({"service": "api"})' in out
    assert "decision: approved" in out
    assert "tool result: api is deployed" in out
    assert "outcome: completed: Result: api is deployed" in out
    assert "gates: {'1:call_1': 'approved'}" in out


@pytest.mark.slow
async def test_deploy_over_http_denied(tmp_path: Path) -> None:
    """Denied: the tool never runs and the model is told why."""
    out = await run_example(tmp_path, "deploy_over_http", "--offline", "--deny")
    assert "decision: denied" in out
    assert "tool result: not approved" in out
    assert "not today" in out
    assert "api is deployed" not in out
    assert "gates: {'1:call_1': 'denied'}" in out


@pytest.mark.slow
async def test_batch_script_rerun_skips_completed_jobs(tmp_path: Path) -> None:
    """Stopped after two jobs, then opened again: nothing is submitted twice, every job
    completes, and a job that completed in the first run is never asked again."""
    out = await run_example(tmp_path, "batch_script", "--offline")
    first, _, second = out.partition("--- the same batch again")
    assert "4 new jobs" in first, out
    assert "stopping early" in first, out
    assert "0 new jobs" in second, out
    assert "4/4 completed, 0 running, 0 queued" in second, out
    done_first = set(re.findall(r"^  completed: (\w+):", first, re.M))
    assert len(done_first) >= 2, out
    asked = json.loads(re.search(r"^model requests per job: (.*)$", out, re.M)[1])  # type: ignore[index]
    assert set(asked) == {"sc", "cancel", "journal", "fencing"}
    assert all(asked[key] == 1 for key in done_first), asked
    assert all(n >= 1 for n in asked.values())
    assert (tmp_path / ".trio_agents" / "batch_script.db").exists()


@pytest.mark.slow
async def test_live_chat_second_message_preempts_the_first(tmp_path: Path) -> None:
    """The story is cut off (partial, not finished) and the second message is answered."""
    out = await run_example(tmp_path, "live_chat", "--offline")
    first = re.search(r"^turn 1: cancelled \(preempted by a new message\): '(.*)'$", out, re.M)
    assert first is not None, out
    assert first[1].startswith("Once upon a time, part 0.")
    assert "part 199" not in first[1]  # cut off, not finished
    assert "turn 2: completed: 'Hello! Here is the short version.'" in out


@pytest.mark.slow
async def test_service_shuts_down_gracefully_and_resumes(tmp_path: Path) -> None:
    """The service's own route and the mounted agent server answer; the shutdown ends the
    run in flight ``cancelled`` / ``shutdown`` for its SSE client, and a new runner on the
    same store resumes it to completion."""
    out = await run_example(tmp_path, "service", "--offline", "--demo")
    assert "GET / -> {'service': 'example', 'agents': '/agents/list-apps'}" in out
    assert "POST /agents/run -> completed 'Hello from the fake model.'" in out
    assert "the stream ended: cancelled (shutdown)" in out
    assert re.search(r"^resumed [0-9a-f]{32}: completed, \d+ characters$", out, re.M), out


@pytest.mark.slow
async def test_stop_button_stops_mid_answer_and_resumes(tmp_path: Path) -> None:
    """Stop after five pieces of the answer: the run ends ``cancelled`` with the partial
    text; the resume under the same id completes the answer."""
    from examples.stop_button import ANSWER

    out = await run_example(tmp_path, "stop_button")
    stopped = re.search(r"-> cancelled \(user pressed stop\); partial: '([^']*)'", out)
    assert stopped is not None, out
    assert 0 < len(stopped[1]) < len(ANSWER)
    assert ANSWER.startswith(stopped[1])
    assert re.search(r"-> resumed \w+: completed: ", out), out
