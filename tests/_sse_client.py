"""Reading an SSE answer with httpx2, frame by frame (the server's tests)."""

from __future__ import annotations

import contextlib
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


class FrameReader:
    """The frames of one SSE answer, read in as many goes as a test likes; use it as an
    async context manager (it closes the response's line iterator)."""

    def __init__(self, response: httpx2.Response) -> None:
        assert response.headers["content-type"].startswith("text/event-stream")
        self._response = response
        self._lines = response.aiter_lines()

    async def __aenter__(self) -> FrameReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # httpx2 leaves an inner async generator unfinished when a half-read iterator is
        # merely closed (trio warns); a closed response's iterator ends at once instead.
        await self._response.aclose()
        with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError):
            async for _ in self._lines:
                pass

    async def read(self, until: Callable[[Frame], bool] | None = None) -> list[Frame]:
        """The next frames until the answer ends (or ``until`` a frame, included)."""
        frames: list[Frame] = []
        fields: dict[str, str] = {}
        data: list[str] = []
        async for line in self._lines:
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


async def read_frames(
    response: httpx2.Response, *, until: Callable[[Frame], bool] | None = None
) -> list[Frame]:
    """All the frames of ``response`` (until it ends, or ``until`` a frame, included)."""
    async with FrameReader(response) as reader:
        return await reader.read(until)


def terminal(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.event == "ended"]
