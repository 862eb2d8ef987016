"""The deciders' side of a gate (:meth:`Runner.decide` - approvals and requests for input -,
``submit_result``, ``submit_credential``): the gate a decision names, read from the invocation's
journal, and what a decider is told when that gate ended already.  The gates themselves - their
ids, kinds, states and waits - are :mod:`trio_agents.approvals`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ._exceptions import GateClosed, UsageError
from .approvals import ENDS, KIND_OF, REQUESTS, GateKind, id_of, tally
from .events import Event, ResultRequested

__all__ = ["find_gate", "find_result_gate", "find_tool", "refuse"]

_WHAT: Final = {
    "approval": "approval",
    "result": "long-running call",
    "credential": "credential request",
    "input": "input request",
}


def find_gate(
    invocation_id: str, gate_id: str, kind: GateKind, events: Iterable[Event]
) -> tuple[Event, str | None]:
    """The request event of gate ``gate_id`` and its journaled end state (``None``: open).

    Raises :class:`~trio_agents.UsageError` naming what the invocation asked for if it never
    asked for that gate, or asked for it as another kind.
    """
    requests: dict[str, Event] = {}
    states: dict[str, str] = {}
    for e in events:
        if isinstance(e, REQUESTS):
            requests[id_of(e)] = e
        elif isinstance(e, ENDS):
            states[id_of(e)] = e.state
    request = requests.get(gate_id)
    if request is None or KIND_OF[type(request)] != kind:
        asked = [g for g, e in requests.items() if KIND_OF[type(e)] == kind]
        what = _WHAT[kind]
        other = f" ({gate_id!r} is a {KIND_OF[type(request)]} gate)" if request is not None else ""
        raise UsageError(
            f"invocation {invocation_id!r} has no {what} {gate_id!r}{other}; "
            + (f"it asked for: {', '.join(asked)}" if asked else "it asked for none")
        )
    return request, states.get(gate_id)


def find_result_gate(invocation_id: str, call_id: str, events: Sequence[Event]) -> str:
    """The gate id of the long-running call ``call_id`` (a model's call id, or the request's
    own id); the open one when several calls shared an id across turns.

    Raises :class:`~trio_agents.UsageError` naming the calls waiting if there is none, or if
    two open gates match (then pass the ``request_id`` of ``result_requested``).
    """
    gates = tally(events)
    matches = [
        e.request_id
        for e in events
        if isinstance(e, ResultRequested) and call_id in (e.request_id, e.call.id)
    ]
    open_ = [g for g in matches if gates[g].state == "open"]
    if len(open_) > 1:
        raise UsageError(
            f"call id {call_id!r} of invocation {invocation_id!r} is ambiguous: "
            f"{', '.join(open_)} wait for a result; pass one of those ids"
        )
    if open_ or matches:
        return (open_ or matches)[-1]
    waiting = [
        f"{e.call.id} ({e.request_id})"
        for e in events
        if isinstance(e, ResultRequested) and gates[e.request_id].state == "open"
    ]
    raise UsageError(
        f"invocation {invocation_id!r} has no long-running call {call_id!r}; "
        + (f"waiting for a result: {', '.join(waiting)}" if waiting else "none waits for a result")
    )


def refuse(gate_id: str, state: str) -> bool:
    """What a decider is told about a gate that ended already: ``False`` if it was decided
    or submitted; :class:`~trio_agents.GateClosed` if it expired or was cancelled."""
    if state in ("expired", "cancelled"):
        raise GateClosed(
            f"gate {gate_id!r} is closed: it ended {state!r}; nothing was recorded",
            gate_id=gate_id,
            state=state,
        )
    return False


def find_tool(agent: object, path: str, name: str) -> Any:
    """The tool ``name`` of the agent at ``path`` in a workflow (``None`` if there is none).

    Walks ``steps`` / ``branches`` / ``body`` by the path's indexes; falls back to the first
    tool of that name anywhere in the tree.
    """
    node: object = agent
    for part in [p for p in path.split("/") if p]:
        index = int(part.split(":", 1)[0])
        children = getattr(node, "steps", None) or getattr(node, "branches", None)
        if children is not None and index < len(children):
            node = children[index]
        elif getattr(node, "body", None) is not None:
            node = node.body  # type: ignore[attr-defined]
        else:
            break
    tools = getattr(node, "tools", None)
    if isinstance(tools, Mapping) and name in tools:
        return tools[name]
    stack = [agent]
    while stack:
        item = stack.pop()
        tools = getattr(item, "tools", None)
        if isinstance(tools, Mapping) and name in tools:
            return tools[name]
        stack.extend(getattr(item, "steps", ()) or ())
        stack.extend(getattr(item, "branches", ()) or ())
        if getattr(item, "body", None) is not None:
            stack.append(item.body)  # type: ignore[attr-defined]
    return None
