"""W3C trace context, carried without any tracing library (layer 0).

A *carrier* is the W3C Trace Context headers as a mapping (``traceparent``, maybe
``tracestate``).  The engine only moves carriers; a tracing integration (:mod:`trio_agents.otel`)
reads and writes them.  Two context variables (trio copies them into every task it spawns):

``incoming``
    the trace context of the request being served: the server sets it from the request's
    headers (HTTP, SSE, WebSocket) for the handler's task, so an invocation started there is
    its child.  The runner stores the carrier of the caller of ``start`` in the invocation's
    ``started`` event (:attr:`~trio_agents.events.InvocationStarted.trace`).
``outgoing``
    headers to send with the outgoing requests of the current task: the model adapters add
    them to every model HTTP request, and :class:`~trio_agents.a2a.RemoteAgent` to every
    request to its A2A server.  A hook sets it around a model call (``on_model_start`` /
    ``on_model_end`` run in the task that streams) and around a tool call (``on_tool_start``
    runs in the task that then runs the tool).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Final

__all__ = ["TRACE_HEADERS", "carrier_in", "carrier_of", "incoming", "outgoing"]

TRACE_HEADERS: Final = ("traceparent", "tracestate")

_EMPTY: Final[Mapping[str, str]] = {}

incoming: ContextVar[Mapping[str, str]] = ContextVar("trio_agents_incoming_trace", default=_EMPTY)
outgoing: ContextVar[Mapping[str, str]] = ContextVar("trio_agents_outgoing_trace", default=_EMPTY)


def carrier_of(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The trace context headers among raw ASGI ``headers`` (names lower-case); a
    ``traceparent`` that is not 55 visible ASCII characters is dropped, with its
    ``tracestate``."""
    found: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("latin-1").lower()
        if key in TRACE_HEADERS:
            found[key] = value.decode("latin-1").strip()
    return _checked(found)


def carrier_in(values: Mapping[str, object] | None) -> dict[str, str]:
    """The trace context entries of a mapping that carries them by name - an MCP request's
    ``params._meta`` (SEP-414) - checked as :func:`carrier_of` checks headers."""
    if not values:
        return {}
    found = {
        key: value.strip() for key in TRACE_HEADERS if isinstance(value := values.get(key), str)
    }
    return _checked(found)


def _checked(found: dict[str, str]) -> dict[str, str]:
    parent = found.get("traceparent", "")
    if len(parent) != 55 or not parent.isascii() or parent.count("-") != 3:
        return {}
    return found
