"""The recorded wire fixtures as a whole: unmodified, each one exercised, error bodies end to end.

``tests/fixtures/wire/`` is third-party data used as it was recorded (see its README).  The
stream recordings are checked per wire format in ``test_openai.py``,
``test_anthropic_recordings.py`` and ``test_openai_responses.py``; the error bodies are served
here, over a real socket, through the model of their API.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.messages import ModelRequest, UserMessage
from trio_agents.models import RetryPolicy
from trio_agents.testing import replay

from . import test_anthropic_recordings, test_openai, test_openai_responses
from ._wire import ANTHROPIC, CHAT, RESPONSES, Wire

WIRE = Path(__file__).parent / "fixtures" / "wire"
METADATA = sorted(WIRE.glob("*.json"))
BODIES = sorted(WIRE.glob("*.body"))
_BY_API = {"messages": ANTHROPIC, "responses": RESPONSES}
_CLASSES: dict[int, type[ta.ModelStatusError]] = {
    400: ta.BadRequestError,
    401: ta.AuthenticationError,
    404: ta.NotFoundError,
}


def _meta(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(path.with_suffix(".json").read_text())
    return meta


def test_every_recording_is_exercised() -> None:
    """Each data file is claimed by exactly one conformance test list: a new recording cannot
    sit in the directory untested."""
    claimed = [
        *test_openai.RECORDINGS,
        *test_anthropic_recordings.RECORDINGS,
        *test_openai_responses.RECORDINGS,
        *BODIES,
    ]
    data_files = sorted(p for p in WIRE.iterdir() if p.suffix in (".sse", ".body"))
    assert sorted(claimed) == data_files
    assert len(claimed) == len(set(claimed)) == len(METADATA) == 29


@pytest.mark.parametrize("meta_path", METADATA, ids=lambda p: p.stem)
def test_recordings_are_byte_for_byte_as_recorded(meta_path: Path) -> None:
    """Size and sha256 match the metadata: no formatter or hand edit has touched the data."""
    meta = json.loads(meta_path.read_text())
    data = (WIRE / meta["file"]).read_bytes()
    assert len(data) == meta["byte_length"]
    assert hashlib.sha256(data).hexdigest() == meta["sha256"]


@pytest.mark.parametrize("path", BODIES, ids=lambda p: p.stem)
async def test_recorded_error_body_reaches_the_caller(path: Path) -> None:
    """A real error response (status, headers, body) through the model of its API: the error
    class of the status, the provider's own message and code, the request id, nothing retried."""
    meta = _meta(path)
    wire: Wire = _BY_API.get(meta["api"], CHAT)
    body = await trio.Path(path).read_bytes()
    error_json = json.loads(body)["error"]
    headers = [
        (name, values[0])
        for name, values in meta["response_headers"].items()
        if name not in ("content-type", "transfer-encoding")
    ]
    id_header = "request-id" if wire is ANTHROPIC else "x-request-id"
    plan = replay(
        body,
        status=meta["status"],
        content_type=meta["response_headers"]["content-type"][0],
        headers=[*headers, (id_header, "req_recorded")],
    )
    request = ModelRequest(messages=(UserMessage(text="hi"),))
    with trio.fail_after(10):
        async with wire.server() as server, wire.model(server, retry=RetryPolicy()) as model:
            server.enqueue(plan)
            with pytest.raises(ta.ModelStatusError) as caught:
                async with model.stream(request):
                    pass
    error = caught.value
    assert type(error) is _CLASSES[meta["status"]], meta["notes"]
    assert error.message == error_json["message"]
    assert error.code == (error_json.get("code") or error_json["type"])
    assert (error.status_code, error.request_id) == (meta["status"], "req_recorded")
    assert str(error) == (
        f"[{wire.provider} {meta['status']}] {error_json['message']} (request id req_recorded)"
    )
    assert error.body == body.decode()
    assert len(server.requests) == 1
