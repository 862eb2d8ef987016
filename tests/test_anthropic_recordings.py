"""Anthropic Messages: the recorded real streams in ``tests/fixtures/wire/``, read by an
independent reading of each file, fed whole, byte by byte, split anywhere (Hypothesis), and
replayed over a real socket."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trio_agents as ta
from trio_agents.messages import ModelRequest, ModelResponse, UserMessage
from trio_agents.models import Anthropic
from trio_agents.models._base import StreamChunk, TextChunk
from trio_agents.models._http import SSEDecoder
from trio_agents.models.anthropic import AnthropicParser
from trio_agents.testing import open_fake_anthropic_server, replay

WIRE = Path(__file__).parent / "fixtures" / "wire"
HELLO = ModelRequest(messages=(UserMessage(text="hi"),))


# --- recorded real streams ----------------------------------------------------------------------


def _recordings() -> list[Path]:
    paths = []
    for meta_path in sorted(WIRE.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        if meta["api"] == "messages" and meta["file"].endswith(".sse"):
            paths.append(WIRE / meta["file"])
    return paths


RECORDINGS = _recordings()


@attrs.frozen
class Expected:
    """What a recording says, read with plain string splitting (independent of the decoder)."""

    text: str
    thinking: str
    signatures: tuple[str, ...]
    redacted: tuple[str, ...]
    calls: tuple[tuple[str, str, str], ...]
    stop_reason: str | None
    usage: dict[str, int]
    model: str | None
    error: str | None


def read_recording(data: bytes) -> Expected:
    """Split on blank lines; read ``event:`` / ``data:`` lines; fold the blocks by index."""
    text, thinking, stop, model, error = "", "", None, None, None
    signatures: list[str] = []
    redacted: list[str] = []
    calls: dict[int, list[str]] = {}
    usage: dict[str, int] = {}
    for block in data.decode().split("\n\n"):
        lines = block.split("\n")
        event = next((ln[len("event: ") :] for ln in lines if ln.startswith("event: ")), "")
        payload = next((ln[len("data: ") :] for ln in lines if ln.startswith("data: ")), "")
        if not payload:
            continue
        body = json.loads(payload)
        if event == "error":
            error = body["error"]["message"]
            break
        if event == "message_start":
            model = body["message"]["model"]
            usage.update(body["message"]["usage"])
        elif event == "message_delta":
            stop = body["delta"]["stop_reason"]
            usage.update(body["usage"])
        elif event == "content_block_start":
            content = body["content_block"]
            if content["type"] == "tool_use":
                calls[body["index"]] = [content["id"], content["name"], ""]
            elif content["type"] == "redacted_thinking":
                redacted.append(content["data"])
        elif event == "content_block_delta":
            change = body["delta"]
            if change["type"] == "text_delta":
                text += change["text"]
            elif change["type"] == "thinking_delta":
                thinking += change["thinking"]
            elif change["type"] == "signature_delta":
                signatures.append(change["signature"])
            elif change["type"] == "input_json_delta":
                calls[body["index"]][2] += change["partial_json"]
    return Expected(
        text=text,
        thinking=thinking,
        signatures=tuple(signatures),
        redacted=tuple(redacted),
        calls=tuple((c[0], c[1], c[2]) for _, c in sorted(calls.items())),
        stop_reason=stop,
        usage={k: v for k, v in usage.items() if isinstance(v, int)},
        model=model,
        error=error,
    )


def parse_pieces(pieces: Sequence[bytes]) -> tuple[list[StreamChunk], ModelResponse | Exception]:
    """Feed pieces through the live stream's decoder and the parser, as the stream does."""
    decoder, parser = SSEDecoder(provider="anthropic"), AnthropicParser()
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
    if expected.error is not None:
        assert isinstance(result, ta.StreamErrorEvent), notes
        assert result.message == expected.error, notes
        return
    assert isinstance(result, ModelResponse), notes
    message = result.message
    assert message.text == expected.text, notes
    assert "".join(r.text for r in message.reasoning) == expected.thinking, notes
    assert tuple(r.signature for r in message.reasoning if r.signature) == expected.signatures
    assert tuple(r.redacted for r in message.reasoning if r.redacted) == expected.redacted
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == list(expected.calls), notes
    for call in message.tool_calls:
        assert isinstance(json.loads(call.arguments), dict), notes  # complete JSON
    assert result.finish_reason == expected.stop_reason, notes
    assert result.model == expected.model, notes
    usage = expected.usage
    prompt = sum(
        usage.get(key, 0)
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    assert result.usage.input_tokens == prompt, notes
    assert result.usage.cache_read_tokens == usage.get("cache_read_input_tokens", 0), notes
    assert result.usage.output_tokens == usage["output_tokens"], notes


def test_the_recordings_cover_the_interesting_cases() -> None:
    """Guard against an empty glob: text, parallel tool calls, thinking with a signature,
    redacted thinking and a ``max_tokens`` stop all appear."""
    expected = [read_recording(path.read_bytes()) for path in RECORDINGS]
    assert len(RECORDINGS) == 6
    assert all(e.text for e in expected)
    assert any(len(e.calls) == 2 for e in expected)
    assert any(e.thinking and e.signatures for e in expected)
    assert any(len(e.redacted) == 2 for e in expected)
    assert {e.stop_reason for e in expected} == {"end_turn", "tool_use", "max_tokens"}


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_recorded_stream_parses_to_what_it_says(path: Path) -> None:
    """Each real Messages recording, fed whole: text, thinking, calls, stop reason, usage."""
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
    """Hypothesis: any byte boundaries (inside padded JSON, between ``\\n`` and ``\\n``)."""
    data = path.read_bytes()
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    chunks, result = parse_pieces(pieces)
    assert chunks == parse_pieces([data])[0]
    check_against_recording(path, result)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
async def test_recorded_stream_over_a_real_socket(path: Path) -> None:
    """Replayed by the fake server in 7-byte pieces, through :class:`Anthropic`."""
    with trio.fail_after(10):
        async with (
            open_fake_anthropic_server() as server,
            Anthropic("claude-test", base_url=server.base_url, api_key="k") as model,
        ):
            server.enqueue(replay(await trio.Path(path).read_bytes(), chunk_sizes=7))
            async with model.stream(HELLO) as stream:
                async for _ in stream:
                    pass
                result = stream.response
    check_against_recording(path, result)
    assert server.requests[0].path == "/v1/messages"
