"""Every code block in ``docs/*.md`` runs here, so the docs cannot rot.

Conventions for writers of ``docs/*.md`` (every ``.md`` file in ``docs/`` is picked up; one
test per file, named after it):

- Fenced blocks run **in document order, in one temporary directory per file** (the working
  directory; it holds a copy of ``examples/``), with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``
  pointing at a fake OpenAI-compatible server on 127.0.0.1 (:func:`docs_model`, its rules
  below).  So ``ta.models.OpenAIChat("gpt-4o-mini")`` in a block talks to the fake; no block
  may need a real key or the network, and no block may set ``OPENAI_*`` itself.
- ```` ```python ````: executed with ``exec`` (in a thread, so a hang fails after
  ``RUN_TIMEOUT``), **all the blocks of one file in one namespace**, in order: a later block
  may use what an earlier one defined (``__name__`` is ``"__main__"`` there).  Write whole
  programs (``trio.run(main)``), not fragments with a top-level ``await``.  A block that
  serves forever must take a ``shutdown_trigger`` (or similar) that a later block uses, and
  bind port 0 when it runs here; nothing may wait for a signal (the blocks do not run in
  the main thread).
- ```` ```console ````: lines starting ``$ `` are commands (run by ``bash -c`` in the file's
  directory, with the worktree on ``PYTHONPATH``, so ``python -m examples.X`` and
  ``trio-agents ... examples.X:agent`` work); the lines after a command, up to the next
  ``$ `` line, are its expected output (stdout and stderr), compared line by line after
  stripping trailing spaces; ``...`` matches any text (within a line, or whole lines when
  alone on one).  A command must exit 0.
- ```` ```bash ````: every line that is not blank or a ``#`` comment is one command, run as
  above; its output is not compared.
- ```` ```json ````: must parse as JSON.  ```` ```text ````: not code (a diagram, a shape):
  not run.  Any other fence, or a fence with no language, fails the test: say what it is.

The fake model (:func:`docs_model`), by the request it gets:

1. tools are offered and the last user message has no tool results after it: it calls
   **every** offered tool once, all in one turn (they run in parallel), with arguments made
   from each schema - a string is the last word of the user's message (``"Deploy api"``
   gives ``"api"``), an integer ``1``, a number ``1.0``, a boolean ``true``;
2. after tool results: ``"Done: "`` and the results joined by ``"; "``;
3. a user message containing ``"story"``: a long answer, one word every 5 ms (something to
   cancel);
4. anything else: ``"You said: <the message>"``, in three pieces.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_agents.messages import ToolCall
from trio_agents.testing import FakeServer, ResponsePlan, openai_stream

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOC_FILES = sorted(DOCS.glob("*.md"))
RUN_TIMEOUT = 60.0
STORY = " ".join(f"word{i}" for i in range(100))

# Setting OPENAI_* (Python or shell), or naming a real provider's endpoint.
SETS_ENDPOINT = re.compile(r"OPENAI_\w+['\"\]]*\s*=(?!=)|api\.openai\.com|api\.anthropic\.com")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[^\s`]*)[^\n]*$")


@attrs.frozen
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence


def blocks_of(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, start = len(m["indent"]), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        if i == len(lines):
            raise AssertionError(f"line {start + 1}: a fence that is never closed")
        found.append(Block(m["lang"], "\n".join(body) + "\n", start + 1))
        i += 1
    return found


# ==== the fake model ===========================================================================


def _argument(schema: dict[str, Any], word: str) -> object:
    kind = schema.get("type")
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return True
    return word


def docs_answer(body: Any) -> tuple[list[str], list[ToolCall], float]:
    """What the fake model of the docs answers: ``(text pieces, tool calls, delay)`` (the
    rules are in the module docstring)."""
    messages: list[dict[str, Any]] = body.get("messages", []) if isinstance(body, dict) else []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = str(messages[last_user].get("content", "")) if last_user >= 0 else ""
    results = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
    tools = (body.get("tools") or []) if isinstance(body, dict) else []
    if results:
        return ["Done: " + "; ".join(str(m.get("content")) for m in results)], [], 0.0
    if tools:
        words = re.findall(r"[\w.-]+", question)
        word = words[-1] if words else "x"
        calls = []
        for index, spec in enumerate(tools):
            fn = spec["function"]
            props = fn.get("parameters", {}).get("properties", {})
            args = {name: _argument(schema, word) for name, schema in props.items()}
            calls.append(ToolCall(id=f"call_{index}", name=fn["name"], arguments=json.dumps(args)))
        return [], calls, 0.0
    if "story" in question.lower():
        return [w + " " for w in STORY.split()], [], 0.005
    said = f"You said: {question}"
    third = max(1, len(said) // 3)
    return [said[:third], said[third : 2 * third], said[2 * third :]], [], 0.0


def docs_model(body: Any) -> ResponsePlan:
    """The fake model's answer to ``body`` as a chat-completions stream."""
    text, calls, delay = docs_answer(body)
    return openai_stream(text, tool_calls=calls, delay=delay)


class ModelThread:
    """The fake model server, served by its own ``trio.run`` in a thread (the blocks call
    ``trio.run`` themselves, so the test cannot be a trio test)."""

    def __init__(self) -> None:
        self.server = FakeServer(base_path="/v1", responder=docs_model)
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.server.serve)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def __enter__(self) -> ModelThread:
        self._thread.start()
        assert self._ready.wait(30), "the fake model server did not start"
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._token is not None
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with ModelThread() as thread:
        yield thread.server.base_url


# ==== running the blocks =======================================================================


def _expected_regex(expected: list[str]) -> re.Pattern[str]:
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*?".join(map(re.escape, line.split("..."))) + r"\n")
    return re.compile("".join(parts))


def run_console(block: Block, where: str, cwd: Path, env: dict[str, str]) -> None:
    commands: list[tuple[str, list[str]]] = []
    if block.lang == "console":
        for line in block.code.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands:
                commands[-1][1].append(line.rstrip())
            elif line.strip():
                raise AssertionError(f"{where}: output before the first `$ ` command: {line!r}")
    else:
        commands = [
            (line, []) for line in block.code.splitlines() if line.strip() and line[0] != "#"
        ]
    for command, expected in commands:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        output = "".join(line.rstrip() + "\n" for line in (done.stdout + done.stderr).splitlines())
        assert done.returncode == 0, f"{where}: `{command}` exited {done.returncode}:\n{output}"
        while expected and not expected[-1]:
            expected.pop()
        if expected:
            pattern = _expected_regex(expected)
            assert pattern.fullmatch(output), (
                f"{where}: `{command}` printed\n{output}\nwhich does not match the block's\n"
                + "\n".join(expected)
            )


def run_python(block: Block, where: str, namespace: dict[str, Any]) -> None:
    """Execute ``block`` in ``namespace``, in a thread so that a block that hangs fails the
    test after ``RUN_TIMEOUT`` seconds instead of stopping the suite."""
    code = compile(block.code, where, "exec")
    failed: list[BaseException] = []

    def execute() -> None:
        try:
            exec(code, namespace)
        except BaseException as exc:  # handed to the test's thread, which raises it
            failed.append(exc)

    thread = threading.Thread(target=execute, name=where, daemon=True)
    thread.start()
    thread.join(RUN_TIMEOUT)
    if thread.is_alive():
        pytest.fail(f"{where}: still running after {RUN_TIMEOUT:g} s; does it serve forever?")
    if failed:
        raise failed[0]


def test_the_docs_have_pages() -> None:
    """The docs exist where this test looks (a test that finds nothing checks nothing)."""
    names = {p.name for p in DOC_FILES}
    assert {"index.md", "concepts.md", "cancellation.md", "http-api.md"} <= names


@pytest.mark.parametrize("path", DOC_FILES, ids=[p.name for p in DOC_FILES])
def test_every_block_runs(
    path: Path, model_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each block of the page runs as its fence says (see the module docstring)."""
    blocks = blocks_of(path.read_text())
    shutil.copytree(
        ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_BASE_URL", model_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-docs")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for block in blocks:
        where = f"{path.relative_to(ROOT)}:{block.line}"
        assert block.lang in ("text", "json") or not SETS_ENDPOINT.search(block.code), (
            f"{where}: a block must not set OPENAI_* or name a real endpoint; the test points "
            "OPENAI_BASE_URL at the fake model"
        )
        if block.lang == "python":
            run_python(block, where, namespace)
        elif block.lang in ("console", "bash"):
            run_console(block, where, tmp_path, env)
        elif block.lang == "json":
            json.loads(block.code)
        elif block.lang != "text":
            raise AssertionError(
                f"{where}: a ```{block.lang} block; use python, console, bash, json or text "
                "(see tests/test_docs.py)"
            )


def test_the_http_api_page_is_generated() -> None:
    """``docs/http-api.md`` is what the generator makes from ``/openapi.json`` now."""
    spec = importlib.util.spec_from_file_location("_gen_http_api", DOCS / "_gen_http_api.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = trio.run(module.render)
    assert (DOCS / "http-api.md").read_text() == fresh, (
        "docs/http-api.md is out of date with the server's /openapi.json; regenerate it with "
        "`python docs/_gen_http_api.py`"
    )


def test_blocks_of_reads_fences() -> None:
    """The block reader: languages, indented fences, line numbers."""
    text = "intro\n```python\nx = 1\n```\n\n  ```console\n  $ echo hi\n  hi\n  ```\n"
    assert blocks_of(text) == [
        Block("python", "x = 1\n", 2),
        Block("console", "$ echo hi\nhi\n", 6),
    ]
    with pytest.raises(AssertionError, match="never closed"):
        blocks_of("```python\nx = 1\n")


def test_expected_output_matching() -> None:
    """``...`` matches within a line and whole lines; anything else must be equal."""
    assert _expected_regex(["a ... c", "...", "end"]).fullmatch("a b c\nx\ny\nend\n")
    assert _expected_regex(["a ... c", "end"]).fullmatch("a b c\nend\n")
    assert not _expected_regex(["a c"]).fullmatch("a b c\n")
    assert not _expected_regex(["end"]).fullmatch("end\nmore\n")


def test_the_fake_model_follows_its_rules() -> None:
    """The rules the docstring promises writers."""
    params = {"properties": {"service": {"type": "string"}, "n": {"type": "integer"}}}
    tools = [
        {"type": "function", "function": {"name": "deploy", "parameters": params}},
        {"type": "function", "function": {"name": "status", "parameters": {}}},
    ]
    user = {"role": "user", "content": "Deploy api"}
    _, calls, _ = docs_answer({"messages": [user], "tools": tools})
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("deploy", {"service": "api", "n": 1}),
        ("status", {}),
    ]
    result = {"role": "tool", "content": "ok"}
    assert docs_answer({"messages": [user, result], "tools": tools}) == (["Done: ok"], [], 0.0)
    text, calls, _ = docs_answer({"messages": [{"role": "user", "content": "hi"}]})
    assert "".join(text) == "You said: hi"
    assert len(text) == 3
    assert not calls
    text, _, delay = docs_answer({"messages": [{"role": "user", "content": "a story"}]})
    assert len(text) == 100
    assert delay > 0
