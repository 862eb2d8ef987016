"""Which models an agent or a workflow uses, so that their owner can open them.

Models are owned resources (see :class:`~trio_agents.models.Model`): whoever runs an agent opens
its models first.  :func:`models_of` lists them; the runner, the CLI and the demo open each one
with ``async with`` (a model shared by several steps is listed, and opened, once).
"""

from __future__ import annotations

from ..models._base import Model
from ..tools import Toolset
from ._context import AgentLike
from .llm import Agent
from .workflow import Loop, Parallel, Sequential

__all__ = ["models_of", "toolsets_of"]


def toolsets_of(agent: AgentLike) -> list[Toolset]:
    """Every toolset (e.g. an MCP server) ``agent`` uses, found like :func:`models_of`."""
    found: dict[int, Toolset] = {}
    for each in _agents_in(agent):
        for toolset in each.toolsets:
            found.setdefault(id(toolset), toolset)
    return list(found.values())


def _agents_in(agent: AgentLike) -> list[Agent]:
    found: list[Agent] = []
    seen: set[int] = set()
    pending: list[AgentLike] = [agent]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        children: tuple[AgentLike, ...] = ()
        if isinstance(current, Agent):
            found.append(current)
        elif isinstance(current, Sequential):
            children = current.steps
        elif isinstance(current, Parallel):
            children = current.branches
        elif isinstance(current, Loop):
            children = (current.body,)
        pending.extend(reversed(children))
    return found


def models_of(agent: AgentLike) -> list[Model]:
    """Every model ``agent`` uses: an :class:`Agent`'s model, and those of a workflow's steps
    (``Sequential.steps``, ``Parallel.branches``, ``Loop.body``), recursively.

    Deduplicated by identity, in first-seen order (depth first, steps in order).  An agent-like
    object of another kind contributes nothing: it opens its own models, if it has any.
    """
    found: dict[int, Model] = {}
    seen: set[int] = set()
    pending: list[AgentLike] = [agent]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        children: tuple[AgentLike, ...] = ()
        if isinstance(current, Agent):
            found.setdefault(id(current.model), current.model)
        elif isinstance(current, Sequential):
            children = current.steps
        elif isinstance(current, Parallel):
            children = current.branches
        elif isinstance(current, Loop):
            children = (current.body,)
        pending.extend(reversed(children))
    return list(found.values())
