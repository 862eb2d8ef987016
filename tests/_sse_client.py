"""Reading an SSE answer with httpx2, frame by frame (the server's tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx2


@attrs.frozen
class Frame:
    id: str | None
    event: str
    data: dict[str, Any]


async def read_frames(
    response: httpx2.Response, *, until: Callable[[Frame], bool] | None = None
) -> list[Frame]:
    """The frames of ``response`` until it ends (or ``until`` a frame, included)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    frames: list[Frame] = []
    fields: dict[str, str] = {}
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                frame = Frame(
                    id=fields.get("id"),
                    event=fields.get("event", "message"),
                    data=json.loads("\n".join(data)),
                )
                frames.append(frame)
                if until is not None and until(frame):
                    return frames
            fields, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        else:
            fields[name] = value
    return frames


def terminal(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.event == "ended"]
