"""The examples, run offline as a user would (``python -m examples.NAME --offline``), each
checked for what it is meant to show, not only for its exit status."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_agents.messages import ToolCall
from trio_agents.testing import (
    FakeServer,
    ResponsePlan,
    open_fake_openai_server,
    openai_stream,
)

from .test_cli import ROOT, command


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


async def run_command(
    tmp_path: Path, server: FakeServer, *args: str, stdin: bytes = b""
) -> tuple[int, str]:
    """``trio-agents ARGS`` in ``tmp_path`` against ``server`` (the only model endpoint);
    its exit status and stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TRIO_AGENTS_"))}
    env.update(PYTHONPATH=str(ROOT), OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=server.base_url)
    with trio.fail_after(60):
        done = await trio.run_process(
            [*command(), *args, "--store", f"sqlite:///{tmp_path / 'agents.db'}"],
            cwd=tmp_path,
            env=env,
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


@pytest.mark.slow
async def test_weather_agent_runs_its_tool(tmp_path: Path) -> None:
    """`trio-agents run examples.weather:agent ...`: the tool runs, the model gets its result."""
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(tool_calls=[call]), openai_stream(["Take ", "an umbrella."]))
        status, out = await run_command(tmp_path, server, "run", "examples.weather:agent", "Paris?")
    assert status == 0, out
    assert "← get_weather: 14 °C and light rain in Paris" in out
    assert "Take an umbrella." in out
    tool = [m for m in server.requests[1].json["messages"] if m["role"] == "tool"]
    assert tool[0]["content"] == "14 °C and light rain in Paris"


@pytest.mark.slow
async def test_deploy_agent_asks_before_it_deploys(tmp_path: Path) -> None:
    """`trio-agents run examples.deploy:agent ...`: asked first; `y` deploys."""
    call = ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(tool_calls=[call]), openai_stream(["Shipped."]))
        status, out = await run_command(
            tmp_path, server, "run", "examples.deploy:agent", "Ship api", stdin=b"y\n"
        )
    assert status == 0, out
    assert 'approve deploy({"service": "api"})?' in out
    assert "← deploy: api is deployed" in out
    assert "Shipped." in out


@pytest.mark.slow
async def test_summarize_agent_answers_a_batch(tmp_path: Path) -> None:
    """`trio-agents batch examples/jobs.jsonl --agent examples.summarize:agent`: one outcome
    line per job, each the answer to its own prompt."""

    def answer(body: Any) -> ResponsePlan:
        prompt = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        return openai_stream(["In short: ", prompt])

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text((ROOT / "examples" / "jobs.jsonl").read_text())
    async with open_fake_openai_server(responder=answer) as server:
        status, out = await run_command(
            tmp_path,
            server,
            "batch",
            str(jobs),
            "--agent",
            "examples.summarize:agent",
            "--out",
            str(tmp_path / "answers.jsonl"),
        )
    assert status == 0, out
    lines = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    prompts = {j["key"]: j["prompt"] for j in map(json.loads, jobs.read_text().splitlines())}
    assert {line["key"]: line["output"] for line in lines} == {
        key: f"In short: {prompt}" for key, prompt in prompts.items()
    }


# Each example, and the test here that runs it offline: an example without one fails this.
@pytest.mark.slow
async def test_mcp_server_tools_through_an_agent() -> None:
    """``examples/mcp_server.py`` over stdio: its ``add`` tool, called by an agent's model,
    answers through the MCP server process."""
    import trio_agents as ta
    from trio_agents.events import ToolCallFinished
    from trio_agents.models import ScriptedModel, ScriptedTurn

    server = ta.mcp.MCPServer.stdio(sys.executable, [str(ROOT / "examples" / "mcp_server.py")])
    model = ScriptedModel([ScriptedTurn.call("add", '{"a": 40, "b": 2}'), "the sum is 42"])
    agent = ta.Agent(name="adder", model=model, tools=[server])
    with trio.fail_after(60):
        async with ta.Runner() as runner:
            outcome = await runner.run(agent, "add 40 and 2")
            events = await runner.store.load_events(outcome.invocation_id)
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    assert (finished.result.content, finished.result.is_error) == ("42", False)
    assert outcome.status == "completed"


RUN_BY = {
    "research": test_research_runs_its_tools_in_parallel,
    "deploy_over_http": test_deploy_over_http_approved,
    "batch_script": test_batch_script_rerun_skips_completed_jobs,
    "live_chat": test_live_chat_second_message_preempts_the_first,
    "service": test_service_shuts_down_gracefully_and_resumes,
    "stop_button": test_stop_button_stops_mid_answer_and_resumes,
    "weather": test_weather_agent_runs_its_tool,
    "deploy": test_deploy_agent_asks_before_it_deploys,
    "summarize": test_summarize_agent_answers_a_batch,
    "mcp_server": test_mcp_server_tools_through_an_agent,
}


def test_every_example_is_run_here() -> None:
    found = {p.stem for p in (ROOT / "examples").glob("*.py") if p.stem != "__init__"}
    assert found == set(RUN_BY), f"examples with no test: {sorted(found - set(RUN_BY))}"
