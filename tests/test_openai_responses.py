"""OpenAI Responses API: request bodies, the stream parser, recorded real streams, and whole
turns against the fake OpenAI server."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import TurnFinished
from trio_agents.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    Reasoning,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from trio_agents.models import HTTPProvider, Model, OpenAIResponses, RetryPolicy
from trio_agents.models._base import ReasoningChunk, StreamChunk, TextChunk, ToolCallChunk
from trio_agents.models._config import ServerSentEvent
from trio_agents.models._http import SSEDecoder
from trio_agents.models.openai_responses import OpenAIResponsesParser
from trio_agents.runner import Runner
from trio_agents.testing import FakeServer, open_fake_openai_server, replay, responses_stream

WIRE = Path(__file__).parent / "fixtures" / "wire"
HELLO = ModelRequest(messages=(UserMessage(text="hi"),))


def model_for(server: FakeServer, **kw: Any) -> OpenAIResponses:
    kw.setdefault("retry", RetryPolicy(rng=random.Random(0)))
    return OpenAIResponses("gpt-test", base_url=server.base_url, api_key="sk-test", **kw)


async def run(
    model: OpenAIResponses, request: ModelRequest = HELLO
) -> tuple[list[Any], ModelResponse]:
    async with model.stream(request) as stream:
        chunks = [chunk async for chunk in stream]
        return chunks, stream.response


# --- the request --------------------------------------------------------------------------------


def test_request_body_maps_every_message_kind() -> None:
    """Instructions, message items, ``function_call`` and ``function_call_output`` items,
    function tools with ``strict: false``, limits."""
    call = ToolCall(id="call_1", name="weather", arguments='{"city": "Oslo"}')
    request = ModelRequest(
        instructions="Be brief.",
        messages=(
            UserMessage(text="Weather in Oslo?"),
            AssistantMessage(text="Looking.", tool_calls=(call,), reasoning=(Reasoning(text="r"),)),
            ToolResultMessage(
                results=(ToolResult(call_id="call_1", name="weather", content="rain"),)
            ),
            AssistantMessage(text="Rain."),
        ),
        tools=(ToolSpec(name="weather", description="Look it up", parameters={"type": "object"}),),
        max_tokens=100,
        temperature=0.2,
    )
    body = OpenAIResponses("gpt-x", api_key="k").request_body(request)
    assert body == {
        "model": "gpt-x",
        "stream": True,
        "instructions": "Be brief.",
        "max_output_tokens": 100,
        "temperature": 0.2,
        "input": [
            {"type": "message", "role": "user", "content": "Weather in Oslo?"},
            {"type": "message", "role": "assistant", "content": "Looking."},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "weather",
                "arguments": '{"city": "Oslo"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
            {"type": "message", "role": "assistant", "content": "Rain."},
        ],
        "tools": [
            {
                "type": "function",
                "name": "weather",
                "description": "Look it up",
                "parameters": {"type": "object"},
                "strict": False,
            }
        ],
    }


def test_unset_limits_are_left_out_and_extra_body_is_merged() -> None:
    """No ``tools``, ``max_output_tokens`` or ``temperature`` unless set; ``extra_body`` last."""
    assert set(OpenAIResponses("m", api_key="k").request_body(HELLO)) == {
        "model",
        "input",
        "stream",
    }
    model = OpenAIResponses("m", api_key="k", extra_body={"store": False})
    assert model.request_body(HELLO)["store"] is False


def test_settings_are_the_openai_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``, a bearer token; ``provider=`` excludes the
    loose settings; it is a model of the ``openai`` wire."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    model = OpenAIResponses("gpt-5")
    assert model.http_provider.base_url == "https://api.openai.com/v1"
    assert model.request_headers()["authorization"] == "Bearer sk-env"
    assert isinstance(model, Model)
    assert (model.name, model.provider) == ("gpt-5", "openai")
    with pytest.raises(ta.UsageError, match="either provider="):
        OpenAIResponses("m", provider=HTTPProvider(base_url="http://h"), retry=RetryPolicy())


# --- the parser, driven directly ----------------------------------------------------------------


def ev(kind: str, **fields: Any) -> ServerSentEvent:
    return ServerSentEvent(event=kind, data=json.dumps({"type": kind, **fields}))


def feed_all(parser: OpenAIResponsesParser, events: Sequence[ServerSentEvent]) -> list[StreamChunk]:
    return [chunk for event in events for chunk in parser.feed(event)]


def completed(kind: str = "response.completed", **response: Any) -> ServerSentEvent:
    usage = {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 3},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 4},
    }
    body = {"id": "resp_1", "model": "gpt-y", "status": "completed", "usage": usage, **response}
    return ev(kind, response=body)


def test_parser_items_deltas_usage_and_completed() -> None:
    """Reasoning summary, text, two function calls by ``output_index`` (name and ``call_id`` from
    ``output_item.added``); ``response.completed`` carries usage and ends the turn."""
    parser = OpenAIResponsesParser(model="gpt-x", request_id="req")
    fc = {"type": "function_call", "arguments": ""}
    a, b = {"call_id": "a", "name": "f"}, {"call_id": "b", "name": "g"}
    chunks = feed_all(
        parser,
        [
            ev("response.created", response={"id": "resp_1", "model": "gpt-y"}),
            ev("response.output_item.added", output_index=0, item={"type": "reasoning"}),
            ev("response.reasoning_summary_text.delta", output_index=0, delta="think"),
            ev("response.output_item.done", output_index=0, item={"type": "reasoning"}),
            ev("response.output_text.delta", output_index=1, delta="Hel"),
            ev("response.output_text.delta", output_index=1, delta="lo"),
            ev("response.output_text.done", output_index=1, text="Hello"),
            ev("response.output_item.added", output_index=2, item={**fc, "id": "fc_a", **a}),
            ev("response.output_item.added", output_index=3, item={**fc, "id": "fc_b", **b}),
            ev("response.function_call_arguments.delta", output_index=2, delta='{"x"'),
            ev("response.function_call_arguments.delta", item_id="fc_a", delta=": 1}"),
            ev("response.function_call_arguments.done", output_index=2, arguments='{"x": 1}'),
            ev("response.function_call_arguments.done", output_index=3, arguments="{}"),
            completed(),
        ],
    )
    assert chunks[:3] == [ReasoningChunk("think"), TextChunk("Hel"), TextChunk("lo")]
    assert chunks[-1] == ToolCallChunk(index=3, arguments="{}")  # only a .done, no delta
    assert parser.done
    response = parser.finish()
    assert response.message.text == "Hello"
    assert response.message.reasoning == (Reasoning(text="think"),)
    assert response.message.tool_calls == (
        ToolCall(id="a", name="f", arguments='{"x": 1}'),
        ToolCall(id="b", name="g", arguments="{}"),
    )
    assert response.finish_reason == "completed"
    assert response.usage == Usage(
        input_tokens=7, output_tokens=9, cache_read_tokens=3, reasoning_tokens=4, requests=1
    )
    assert (response.model, response.request_id, parser.response_id) == ("gpt-y", "req", "resp_1")


def test_parser_incomplete_ends_the_turn_with_its_reason() -> None:
    """``response.incomplete``: the text so far is the answer, the reason is the finish."""
    parser = OpenAIResponsesParser()
    feed_all(
        parser,
        [
            ev("response.output_text.delta", output_index=0, delta="In the"),
            completed(
                "response.incomplete",
                status="incomplete",
                incomplete_details={"reason": "max_output_tokens"},
            ),
        ],
    )
    response = parser.finish()
    assert (response.message.text, response.finish_reason) == ("In the", "max_output_tokens")


def test_parser_text_from_done_when_no_delta_came() -> None:
    """A server that sends only ``output_text.done`` still gives the text, once."""
    parser = OpenAIResponsesParser()
    chunks = feed_all(
        parser, [ev("response.output_text.done", output_index=0, text="whole"), completed()]
    )
    assert chunks == [TextChunk("whole")]


@pytest.mark.parametrize(
    "event",
    [
        ev("error", code="server_error", message="The server had an error", param=None),
        completed(
            "response.failed",
            status="failed",
            error={"code": "server_error", "message": "The server had an error"},
        ),
    ],
    ids=["error", "response.failed"],
)
def test_parser_error_and_failed_raise_openais_words(event: ServerSentEvent) -> None:
    """Both ways a Responses stream fails are :class:`StreamErrorEvent` with the message and
    code OpenAI sent."""
    with pytest.raises(ta.StreamErrorEvent) as caught:
        OpenAIResponsesParser(request_id="req_7").feed(event)
    error = caught.value
    assert (error.message, error.code, error.request_id) == (
        "The server had an error",
        "server_error",
        "req_7",
    )


def test_parser_rejects_bad_json_and_needs_the_terminal_event() -> None:
    """Bad JSON is malformed; a body that ends before ``response.completed`` is broken."""
    with pytest.raises(ta.MalformedStreamError, match="not valid JSON"):
        OpenAIResponsesParser().feed(ServerSentEvent(event="response.created", data="{"))
    with pytest.raises(ta.MalformedStreamError, match="not a JSON object"):
        OpenAIResponsesParser().feed(ServerSentEvent(data='"text"'))
    parser = OpenAIResponsesParser()
    parser.feed(ev("response.output_text.delta", output_index=0, delta="half"))
    with pytest.raises(ta.StreamBrokenError, match=r"before response\.completed"):
        parser.finish()
    assert parser.partial_text == "half"


# --- recorded real streams ----------------------------------------------------------------------


def _recordings() -> list[Path]:
    paths = []
    for meta_path in sorted(WIRE.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        if meta["api"] == "responses" and meta["file"].endswith(".sse"):
            paths.append(WIRE / meta["file"])
    return paths


RECORDINGS = _recordings()


@attrs.frozen
class Expected:
    """What a recording says, read from its *final* ``response`` object (the snapshot the
    server sends at the end), not from the deltas the parser folds."""

    text: str
    calls: tuple[tuple[str, str, str], ...]
    finish_reason: str
    usage: dict[str, Any]
    model: str
    deltas: int


def read_recording(data: bytes) -> Expected:
    """Split on blank lines, take the last ``data:`` whose type is terminal, read its output."""
    final: dict[str, Any] = {}
    deltas = 0
    for block in data.decode().split("\n\n"):
        for line in block.split("\n"):
            if not line.startswith("data: "):
                continue
            body = json.loads(line[len("data: ") :])
            deltas += body["type"] == "response.output_text.delta"
            if body["type"] in ("response.completed", "response.incomplete"):
                final = body["response"]
    text = "".join(
        part["text"]
        for item in final["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    calls = tuple(
        (item["call_id"], item["name"], item["arguments"])
        for item in final["output"]
        if item["type"] == "function_call"
    )
    details = final.get("incomplete_details") or {}
    return Expected(
        text=text,
        calls=calls,
        finish_reason=details.get("reason") or final["status"],
        usage=final["usage"],
        model=final["model"],
        deltas=deltas,
    )


def parse_pieces(pieces: Sequence[bytes]) -> tuple[list[StreamChunk], ModelResponse | Exception]:
    """Feed pieces through the live stream's decoder and the parser, as the stream does."""
    decoder, parser = SSEDecoder(provider="openai"), OpenAIResponsesParser()
    chunks: list[StreamChunk] = []
    try:
        for piece in [*pieces, None]:
            events = decoder.feed(piece) if piece is not None else decoder.flush()
            for event in events:
                if not parser.done:
                    chunks += parser.feed(event)
        return chunks, parser.finish()
    except ta.ModelError as exc:
        return chunks, exc


def check_against_recording(path: Path, result: ModelResponse | Exception) -> None:
    notes = json.loads(path.with_suffix(".json").read_text())["notes"]
    expected = read_recording(path.read_bytes())
    assert isinstance(result, ModelResponse), notes
    assert result.message.text == expected.text, notes
    calls = [(c.id, c.name, c.arguments) for c in result.message.tool_calls]
    assert calls == list(expected.calls), notes
    for call in result.message.tool_calls:
        assert isinstance(json.loads(call.arguments), dict), notes  # complete JSON
    assert result.finish_reason == expected.finish_reason, notes
    assert result.model == expected.model, notes
    assert result.usage.input_tokens == expected.usage["input_tokens"], notes
    assert result.usage.output_tokens == expected.usage["output_tokens"], notes
    reasoning = expected.usage["output_tokens_details"]["reasoning_tokens"]
    assert result.usage.reasoning_tokens == reasoning, notes


def test_the_recordings_cover_the_interesting_cases() -> None:
    """Guard against an empty glob: text, a function call, ``incomplete``, reasoning tokens."""
    expected = [read_recording(path.read_bytes()) for path in RECORDINGS]
    assert len(RECORDINGS) == 4
    assert any(e.text and e.deltas > 1 for e in expected)
    assert sum(len(e.calls) for e in expected) == 2
    assert {e.finish_reason for e in expected} == {"completed", "max_output_tokens"}
    assert any(e.usage["output_tokens_details"]["reasoning_tokens"] for e in expected)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_recorded_stream_parses_to_what_it_says(path: Path) -> None:
    """Each real Responses recording, fed whole: the deltas add up to the final snapshot."""
    chunks, result = parse_pieces([path.read_bytes()])
    check_against_recording(path, result)
    text = "".join(c.text for c in chunks if isinstance(c, TextChunk))
    assert text == read_recording(path.read_bytes()).text


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_recorded_stream_fed_one_byte_at_a_time(path: Path) -> None:
    """The most extreme split gives the same chunks and the same result."""
    data = path.read_bytes()
    whole = parse_pieces([data])
    single = parse_pieces([data[i : i + 1] for i in range(len(data))])
    assert single[0] == whole[0]
    check_against_recording(path, single[1])


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=0, max_value=40_000), max_size=40))
def test_recorded_stream_split_anywhere_parses_the_same(path: Path, cuts: list[int]) -> None:
    """Hypothesis: any byte boundaries give the same chunks and result."""
    data = path.read_bytes()
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    chunks, result = parse_pieces(pieces)
    assert chunks == parse_pieces([data])[0]
    check_against_recording(path, result)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
async def test_recorded_stream_over_a_real_socket(path: Path) -> None:
    """Replayed by the fake server in 7-byte pieces, through :class:`OpenAIResponses`."""
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(replay(await trio.Path(path).read_bytes(), chunk_sizes=7))
            result = (await run(model))[1]
    check_against_recording(path, result)
    assert server.requests[0].path == "/v1/responses"


# --- whole turns against the fake server --------------------------------------------------------


async def test_text_turn_end_to_end(autojump_clock: trio.abc.Clock) -> None:
    """Chunks arrive as sent; the server got the body and the bearer token."""
    with trio.fail_after(60):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(
                responses_stream(["Hel", "lo"], reasoning=["hm"], delay=1.0, request_id="r9")
            )
            chunks, response = await run(model)
    assert chunks == [ReasoningChunk("hm"), TextChunk("Hel"), TextChunk("lo")]
    assert (response.message.text, response.finish_reason) == ("Hello", "completed")
    assert response.request_id == "r9"
    [record] = server.requests
    assert record.path == "/v1/responses"
    assert record.headers["authorization"] == "Bearer sk-test"
    assert record.json == model.request_body(HELLO)


async def test_tool_calls_round_trip_through_an_agent() -> None:
    """Turn one calls two tools; turn two's ``input`` has the calls as ``function_call`` items
    and the results as ``function_call_output`` items."""

    @ta.tool
    async def weather(city: str) -> str:
        """The weather."""
        return f"rain in {city}"

    calls = [
        ToolCall(id="call_1", name="weather", arguments='{"city": "Oslo"}'),
        ToolCall(id="call_2", name="weather", arguments='{"city": "Rome"}'),
    ]
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(responses_stream(tool_calls=calls), responses_stream("Rain in both."))
            async with Runner() as runner:
                outcome = await runner.run(Agent(name="a", model=model, tools=[weather]), "Go")
    assert (outcome.status, outcome.output) == ("completed", "Rain in both.")
    second = server.requests[1].json
    assert second["input"] == [
        {"type": "message", "role": "user", "content": "Go"},
        *[
            {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
            for c in calls
        ],
        {"type": "function_call_output", "call_id": "call_1", "output": "rain in Oslo"},
        {"type": "function_call_output", "call_id": "call_2", "output": "rain in Rome"},
    ]
    assert second["tools"][0]["name"] == "weather"


async def test_incomplete_turn_completes_with_what_was_produced() -> None:
    """``response.incomplete`` (``max_output_tokens``) is a finished turn, not a failure: the
    invocation completes with the partial text and the turn records the reason."""
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(responses_stream(["In the", " city"], incomplete="max_output_tokens"))
            async with Runner() as runner:
                inv = await runner.start(Agent(name="a", model=model), "Tell me a story")
                outcome = await inv.wait()
                events = [e async for e in inv.events()]
    assert (outcome.status, outcome.output) == ("completed", "In the city")
    [turn] = [e for e in events if isinstance(e, TurnFinished)]
    assert turn.finish_reason == "max_output_tokens"
