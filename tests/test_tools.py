"""Tests of trio_agents.tools: schemas, misconfiguration, the Tool.call contract, cancellation."""

from __future__ import annotations

import enum
import functools
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pydantic
import pytest
import trio
import trio.testing

from trio_agents import ToolError, UsageError
from trio_agents.messages import ToolCall, ToolResult, ToolSpec
from trio_agents.tools import Tool, ToolContext, tool


class Color(enum.Enum):
    """A colour the search can filter by."""

    RED = "red"
    BLUE = "blue"


class Address(pydantic.BaseModel):
    """A postal address."""

    street: str
    title: str = "home"  # a property *named* title must survive the title stripping


def _context(call_id: str = "call-1", tool_name: str = "t") -> ToolContext:
    return ToolContext(invocation_id="inv-1", call_id=call_id, tool_name=tool_name)


def _call(t: Tool[..., Any], arguments: str = "{}") -> ToolCall:
    return ToolCall(id="call-1", name=t.name, arguments=arguments)


async def _run(t: Tool[..., Any], arguments: str = "{}") -> ToolResult:
    with trio.fail_after(10):
        return await t.call(_call(t, arguments), _context(tool_name=t.name))


# -- schema -------------------------------------------------------------------------------------


@tool
async def search(
    query: str,
    ctx: ToolContext,
    limit: int = 10,
    mode: Literal["fast", "deep"] = "fast",
    colors: list[Color] | None = None,
    near: Address | None = None,
    tags: Annotated[list[str], pydantic.Field(description="from Field", max_length=3)] = [],  # noqa: B006
) -> str:
    """Search the catalogue.

    Finds items that match a query.

    Args:
        query: what to look for.
        ctx: the call context (never shown to the model).
        limit: at most this many hits.
        tags: from the docstring, overridden by Field.
    """
    return f"{query}:{limit}"


def test_schema_from_signature_and_google_docstring() -> None:
    """Types, defaults, Literal, enums, optional and nested models; no pydantic titles."""
    assert search.name == "search"
    assert search.description == "Search the catalogue.\n\nFinds items that match a query."
    assert search.spec == ToolSpec(name="search", description=search.description)
    assert search.spec.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for."},
            "limit": {"type": "integer", "default": 10, "description": "at most this many hits."},
            "mode": {"type": "string", "enum": ["fast", "deep"], "default": "fast"},
            "colors": {
                "anyOf": [{"type": "array", "items": {"$ref": "#/$defs/Color"}}, {"type": "null"}],
                "default": None,
            },
            "near": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": None},
            "tags": {
                "type": "array",
                "items": {"type": "string"},
                "maxItems": 3,
                "default": [],
                "description": "from Field",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
        "$defs": {
            "Color": {
                "type": "string",
                "enum": ["red", "blue"],
                "description": "A colour the search can filter by.",
            },
            "Address": {
                "type": "object",
                "description": "A postal address.",
                "properties": {
                    "street": {"type": "string"},
                    "title": {"type": "string", "default": "home"},
                },
                "required": ["street"],
            },
        },
    }
    json.dumps(search.spec.parameters)  # plain JSON, ready for any provider


def test_numpy_and_rest_docstrings() -> None:
    """Parameter descriptions are read from NumPy and reST docstrings too."""

    def numpy_style(city: str, days: int = 3) -> str:
        """Forecast the weather.

        Parameters
        ----------
        city : str
            The city name.
        days : int, optional
            How many days ahead.
        """
        return city

    def rest_style(city: str) -> str:
        """Forecast the weather.

        :param city: The city name.
        """
        return city

    for fn in (numpy_style, rest_style):
        t = tool(fn)
        props = t.spec.parameters["properties"]
        assert t.description == "Forecast the weather."
        assert props["city"] == {"type": "string", "description": "The city name."}
    assert tool(numpy_style).spec.parameters["properties"]["days"]["description"] == (
        "How many days ahead."
    )


def test_options_and_a_function_without_parameters() -> None:
    """name=, description= and the flags are kept; no parameters gives an empty object schema."""

    @tool(name="get-time", description="The time.", timeout=2.5, requires_approval=True)
    def now() -> str:
        """Ignored, description= wins."""
        return "noon"

    assert (now.name, now.description, now.timeout) == ("get-time", "The time.", 2.5)
    assert now.requires_approval is True
    assert now.idempotent is False
    assert now.spec.parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert now.fn() == "noon"  # the function itself stays callable for its own unit tests


def test_with_options_returns_a_changed_copy() -> None:
    """with_options changes only what it is given and validates it like the decorator."""
    quick = search.with_options(timeout=1, idempotent=True)
    assert (quick.name, quick.timeout, quick.idempotent) == ("search", 1, True)
    assert quick.spec.parameters == search.spec.parameters
    assert search.timeout is None
    assert search.with_options(name="find").spec.name == "find"
    with pytest.raises(UsageError, match="timeout must be a positive"):
        search.with_options(timeout=0)


async def test_odd_parameters_partials_and_callable_objects() -> None:
    """Positional-only parameters, names pydantic reserves, partials and async callables work."""

    def odd(a: int, /, model_config: str, _private: int = 1, json: bool = False) -> str:
        return f"{a} {model_config} {_private} {json}"

    t = tool(odd)
    assert list(t.spec.parameters["properties"]) == ["a", "model_config", "_private", "json"]
    result = await _run(t, '{"a": 1, "model_config": "m", "json": true}')
    assert result.content == "1 m 1 True"

    async def scale(factor: int, value: int) -> int:
        """Scale a value."""
        return factor * value

    doubled = tool(functools.partial(scale, 2))
    assert (doubled.name, doubled.description) == ("scale", "Scale a value.")
    assert list(doubled.spec.parameters["properties"]) == ["value"]
    assert (await _run(doubled, '{"value": 21}')).content == "42"

    class Greeter:
        """Greets people."""

        async def __call__(self, who: str) -> str:
            await trio.lowlevel.checkpoint()
            return f"hello {who}"

    greet = tool(name="greet")(Greeter())
    assert (await _run(greet, '{"who": "you"}')).content == "hello you"


# -- misconfiguration ---------------------------------------------------------------------------


def no_annotation(query) -> str:  # type: ignore[no-untyped-def]
    return str(query)


def star_args(*queries: str) -> str:
    return ""


def star_kwargs(**options: str) -> str:
    return ""


def no_schema(event: trio.Event) -> str:
    return ""


def generator(n: int) -> Any:
    yield n


def unresolved(x: NotDefinedAnywhere) -> str:  # type: ignore[name-defined]  # noqa: F821
    return ""


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: tool(no_annotation),
            "tool 'no_annotation': parameter 'query' has no type annotation",
        ),
        (lambda: tool(star_args), "tool 'star_args': parameter '*queries' is not allowed"),
        (lambda: tool(star_kwargs), "tool 'star_kwargs': parameter '**options' is not allowed"),
        (
            lambda: tool(no_schema),
            "tool 'no_schema': parameter 'event' has a type with no JSON schema",
        ),
        (lambda: tool(generator), "tool 'generator': a generator cannot be a tool"),
        (lambda: tool(unresolved), "tool 'unresolved': cannot resolve a type annotation"),
        (lambda: tool(42), "@tool needs a function, got 42"),  # type: ignore[call-overload]
        (lambda: tool("search"), "did you mean @tool(name='search')"),  # type: ignore[call-overload]
        (lambda: tool(search), "already a tool; use .with_options"),  # type: ignore[call-overload]
        (lambda: tool(lambda: "x"), "invalid tool name '<lambda>'"),
        (lambda: tool(name="has space")(star_args), "invalid tool name 'has space'"),
        (lambda: tool(name="")(star_args), "invalid tool name ''"),
        (lambda: tool(name="x" * 65)(star_args), "invalid tool name 'xxxx"),
        (lambda: tool(timeout=0)(star_args), "tool 'star_args': timeout must be a positive"),
        (lambda: tool(timeout=-1)(star_args), "timeout must be a positive number of seconds"),
        (lambda: tool(timeout=float("nan"))(star_args), "timeout must be a positive"),
    ],
)
def test_misconfiguration_fails_at_decoration(make: Callable[[], object], message: str) -> None:
    """Every misconfiguration is a UsageError naming the tool and the problem."""
    with pytest.raises(UsageError, match=re.escape(message)):
        make()


def test_64_character_name_is_accepted() -> None:
    """The longest name both OpenAI and Anthropic accept is fine."""

    def ok(x: int) -> int:
        return x

    assert tool(name="a-_9" * 16)(ok).name == "a-_9" * 16


# -- the call contract --------------------------------------------------------------------------


async def test_call_validates_and_passes_arguments() -> None:
    """Arguments are validated (strings coerced where JSON allows) and defaults honoured."""
    result = await _run(search, '{"query": "lamps", "limit": "3"}')
    assert result == ToolResult(call_id="call-1", name="search", content="lamps:3")
    assert (await _run(search, '{"query": "lamps"}')).content == "lamps:10"


async def test_nested_model_and_enum_arrive_as_python_objects() -> None:
    """A nested model arrives as the model instance, an enum as the enum member."""
    seen: list[object] = []

    @tool
    async def ship(to: Address, color: Color) -> str:
        seen.extend([to, color])
        return "ok"

    await _run(ship, '{"to": {"street": "Main St"}, "color": "blue"}')
    assert seen == [Address(street="Main St"), Color.BLUE]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("{}", "Invalid arguments for tool 'search': query: Field required"),
        ("", "Invalid arguments for tool 'search': query: Field required"),
        ('{"query": 3}', "query: Input should be a valid string"),
        ('{"query": "x", "limit": "many"}', "limit: Input should be a valid integer"),
        ('{"query": "x", "mode": "slow"}', "mode: Input should be 'fast' or 'deep'"),
        ('{"query": "x", "colors": ["red", "green"]}', "colors[1]: Input should be 'red' or"),
        ('{"query": "x", "near": {}}', "near.street: Field required"),
        ('{"query": "x", "pages": 2}', "pages: Extra inputs are not permitted"),
        ('{"query": "x", "ctx": {}}', "ctx: Extra inputs are not permitted"),
        ('{"query": ', "Invalid arguments for tool 'search': Invalid JSON: EOF while parsing"),
        ('["x"]', "Invalid arguments for tool 'search': Input should be an object"),
    ],
)
async def test_bad_arguments_come_back_as_error_results(arguments: str, expected: str) -> None:
    """Invalid JSON or arguments give an error result naming the field; nothing is raised."""
    result = await _run(search, arguments)
    assert result.is_error
    assert expected in result.content
    assert (result.call_id, result.name) == ("call-1", "search")


async def test_sync_tool_runs_in_a_worker_thread() -> None:
    """A plain def runs through trio.to_thread, off the trio thread."""

    @tool
    def where() -> int:
        return threading.get_ident()

    result = await _run(where)
    assert not result.is_error
    assert int(result.content) != threading.get_ident()


async def test_async_tool_runs_in_the_calling_task() -> None:
    """An async def tool is awaited directly, in the task that calls Tool.call."""

    @tool
    async def task_name() -> str:
        return trio.lowlevel.current_task().name

    assert (await _run(task_name)).content == trio.lowlevel.current_task().name


@pytest.mark.parametrize(
    ("value", "content"),
    [
        ("plain text", "plain text"),
        ({"a": [1, 2.5, None]}, '{"a":[1,2.5,null]}'),
        (Address(street="x"), '{"street":"x","title":"home"}'),
        (None, "null"),
        ({"when": object}, '{"when":"<class \'object\'>"}'),
    ],
)
async def test_return_value_becomes_text(value: object, content: str) -> None:
    """str as is; everything else as JSON; str() for what JSON cannot hold."""

    @tool
    async def give() -> object:
        return value

    assert await _run(give) == ToolResult(call_id="call-1", name="give", content=content)


@pytest.mark.parametrize(
    ("error", "content"),
    [
        (ToolError("no such city: Atlantis"), "no such city: Atlantis"),
        (ValueError("boom"), "ValueError: boom"),
        (KeyError("k"), "KeyError: 'k'"),
        (RuntimeError(), "RuntimeError"),
        (ExceptionGroup("nursery", [ToolError("inner")]), "inner"),
    ],
)
@pytest.mark.parametrize("sync", [False, True])
async def test_exceptions_become_error_results(
    error: Exception, content: str, sync: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A ToolError's message goes to the model as is; other exceptions as "Type: message".

    Unexpected exceptions are also logged with their traceback; a ToolError is not.
    """

    def fail_sync() -> str:
        raise error

    async def fail_async() -> str:
        raise error

    t = tool(fail_sync if sync else fail_async, name="fail")
    assert await _run(t) == ToolResult(
        call_id="call-1", name="fail", content=content, is_error=True
    )
    logged = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert logged == ([] if content in {"inner", "no such city: Atlantis"} else [error])


# -- ToolContext ---------------------------------------------------------------------------------


async def test_context_is_injected_and_not_in_the_schema() -> None:
    """A ToolContext parameter (also as `| None`) is filled in and hidden from the model."""
    seen: list[ToolContext | None] = []

    @tool
    async def who(ctx: ToolContext, word: str, other: ToolContext | None = None) -> str:
        seen.extend([ctx, other])
        return word

    assert list(who.spec.parameters["properties"]) == ["word"]
    context = ToolContext(
        invocation_id="inv-9", call_id="c-2", tool_name="who", attempt=2, user_id="u1"
    )
    result = await who.call(ToolCall(id="c-2", name="who", arguments='{"word": "hi"}'), context)
    assert result.content == "hi"
    assert seen == [context, context]
    assert context.idempotency_key == "inv-9:c-2"
    assert _context().attempt == 1
    assert _context().user_id is None


def test_idempotency_key_is_stable_and_overridable() -> None:
    """The key depends only on invocation and call id: the same on every attempt."""
    first = ToolContext(invocation_id="i", call_id="c", tool_name="t")
    again = ToolContext(invocation_id="i", call_id="c", tool_name="t", attempt=3)
    assert first.idempotency_key == again.idempotency_key == "i:c"
    assert ToolContext(invocation_id="i", call_id="c", tool_name="t", idempotency_key="k") != first


# -- timeouts and cancellation -------------------------------------------------------------------


async def test_timeout_gives_an_error_result(autojump_clock: trio.testing.MockClock) -> None:
    """The tool's own timeout ends the call with an error result; the tool's finally runs."""
    finished: list[str] = []

    @tool(timeout=5)
    async def slow() -> str:
        try:
            await trio.sleep(10)
        finally:
            finished.append("finally")
        return "done"

    start = trio.current_time()
    result = await _run(slow)
    assert result == ToolResult(
        call_id="call-1", name="slow", content="tool 'slow' timed out after 5s", is_error=True
    )
    assert trio.current_time() - start == pytest.approx(5)
    assert finished == ["finally"]


async def test_sync_tool_timeout() -> None:
    """A sync tool polling check_cancelled() stops at its timeout, reported as a timeout.

    Real time on purpose: under autojump_clock the clock would also jump past the test's own
    fail_after while the thread sleeps between polls -- and that outer cancel would win.
    """

    @tool(timeout=0.05)
    def poll() -> str:
        for _ in range(1000):
            trio.from_thread.check_cancelled()
            time.sleep(0.005)
        return "never stopped"

    assert (await _run(poll)).content == "tool 'poll' timed out after 0.05s"


class _Cancels:
    """Runs a tool call under a scope the test cancels, and records how the call ended."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.ended: list[object] = []

    async def run(self, t: Tool[..., Any]) -> None:
        with self.scope:
            try:
                self.ended.append(await t.call(_call(t), _context(tool_name=t.name)))
            except trio.Cancelled:
                self.ended.append("cancelled")
                raise


@pytest.mark.parametrize("tool_timeout", [None, 1.0, 30.0])
async def test_outer_cancel_propagates(
    autojump_clock: trio.testing.MockClock,
    tool_timeout: float | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cancel from an enclosing scope leaves Tool.call as trio.Cancelled, never a result.

    With tool_timeout=1.0 the tool's own timeout expires at the same moment as the outer scope: the
    outer cancel still wins, and it is not reported as a timeout.
    """
    finished: list[str] = []

    @tool(timeout=tool_timeout)
    async def sleepy() -> str:
        try:
            await trio.sleep(100)
        finally:
            finished.append("finally")
        return "done"

    ended: list[object] = []
    with trio.move_on_after(1) as scope:
        try:
            ended.append(await sleepy.call(_call(sleepy), _context()))
        except trio.Cancelled:
            ended.append("cancelled")
            raise
    assert scope.cancelled_caught
    assert ended == ["cancelled"]
    assert finished == ["finally"]
    assert caplog.records == []  # a cancel is not a tool failure, not even in the log


async def test_except_exception_cannot_turn_cancel_into_a_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`except Exception` in a tool does not see Cancelled, so the cancel still propagates."""
    seen: list[str] = []

    @tool
    async def careful() -> str:
        try:
            await trio.sleep(100)
        except Exception as exc:
            seen.append(repr(exc))
            return "handled"
        return "done"

    calls = _Cancels()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.run, careful)
            await trio.testing.wait_all_tasks_blocked()
            calls.scope.cancel()
    assert calls.scope.cancelled_caught
    assert calls.ended == ["cancelled"]
    assert seen == []


async def test_tool_swallowing_cancelled_still_cannot_produce_a_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Even a tool that wrongly swallows Cancelled and returns yields no result under a cancel."""

    @tool
    async def rogue() -> str:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            return "swallowed"  # breaks trio's rules on purpose
        return "done"

    with trio.move_on_after(1) as scope:
        await rogue.call(_call(rogue), _context())
        pytest.fail("Tool.call returned under a cancel")
    assert scope.cancelled_caught


async def test_sync_tool_check_cancelled_stops_on_cancel() -> None:
    """A sync tool polling trio.from_thread.check_cancelled() stops once the call is cancelled."""
    started = trio.Event()
    stopped = threading.Event()

    @tool
    def crunch() -> str:
        trio.from_thread.run_sync(started.set)
        try:
            for _ in range(2000):
                trio.from_thread.check_cancelled()
                time.sleep(0.005)
            return "never cancelled"
        finally:
            stopped.set()

    calls = _Cancels()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.run, crunch)
            await started.wait()
            calls.scope.cancel()
    assert calls.ended == ["cancelled"]
    assert calls.scope.cancelled_caught
    assert stopped.is_set()


async def test_sync_tool_delays_cancel_until_it_returns() -> None:
    """A sync tool that does not poll holds the cancel until it returns; then Cancelled."""
    started = trio.Event()
    release = threading.Event()
    returned = threading.Event()

    @tool
    def blocking() -> str:
        trio.from_thread.run_sync(started.set)
        release.wait(timeout=5)
        returned.set()
        return "late"

    calls = _Cancels()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.run, blocking)
            await started.wait()
            calls.scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert calls.ended == []  # still waiting for the thread: abandon_on_cancel=False
            release.set()
    assert returned.is_set()
    assert calls.ended == ["cancelled"]
    assert calls.scope.cancelled_caught
