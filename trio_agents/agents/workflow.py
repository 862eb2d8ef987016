"""Workflow agents: :class:`Sequential`, :class:`Parallel`, :class:`Loop`.

Each step runs in a child context with its own ``path`` (``"<index>:<name>"``), so its events
are journaled apart from its siblings'.  When a step finishes, a ``step_finished`` event with its
output is journaled; a resumed workflow reads those and skips the finished steps, and a step that
was interrupted resumes from its own journal (its finished turns and tool results are kept).

Steps between them are safe points: ``after_turn`` / ``after_tools`` cancels stop there.  Parallel
branches run in one nursery; a safe-point stop in one branch lets the others reach their own
safe points instead of cutting them short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from .._exceptions import UsageError
from ..events import StepFinished
from ._context import AgentLike, RunContext, StopRequested

__all__ = ["Loop", "Parallel", "Sequential"]


def _finished_steps(ctx: RunContext) -> dict[str, str]:
    """Outputs of this workflow's direct children that finished, by path."""
    prefix = f"{ctx.path}/" if ctx.path else ""
    done: dict[str, str] = {}
    for event in ctx.journal:
        if (
            isinstance(event, StepFinished)
            and event.path.startswith(prefix)
            and "/" not in event.path[len(prefix) :]
        ):
            done[event.path] = event.output
    return done


def _check_steps(kind: str, name: str, steps: Sequence[AgentLike]) -> tuple[AgentLike, ...]:
    if not isinstance(name, str) or not name or "/" in name:
        raise UsageError(f"a {kind} needs a non-empty name without '/', got {name!r}")
    if not isinstance(steps, (list, tuple)) or not steps:
        raise UsageError(f"{kind} {name!r} needs a non-empty list of agents")
    for step in steps:
        if not callable(getattr(step, "run", None)) or not isinstance(
            getattr(step, "name", None), str
        ):
            raise UsageError(f"{kind} {name!r}: {step!r} is not an agent or a workflow")
    return tuple(steps)


async def _run_step(ctx: RunContext, key: str, step: AgentLike, text: str) -> str:
    async with ctx.step(key, text) as child:
        output = await step.run(child)
        await child.record_step_finished(output)
    return output


class Sequential:
    """Run steps one after another; each step's input is the previous step's output."""

    def __init__(self, *, name: str, steps: Sequence[AgentLike]) -> None:
        self.steps = _check_steps("Sequential", name, steps)
        self.name = name

    def __repr__(self) -> str:
        return f"Sequential(name={self.name!r}, steps={[s.name for s in self.steps]})"

    async def run(self, ctx: RunContext) -> str:
        done = _finished_steps(ctx)
        text = ctx.input
        for index, step in enumerate(self.steps):
            key = f"{index}:{step.name}"
            path = f"{ctx.path}/{key}" if ctx.path else key
            if path in done:
                text = done[path]
                continue
            ctx.check_stop()
            text = await _run_step(ctx, key, step, text)
        return text


def _join_outputs(outputs: Sequence[tuple[str, str]]) -> str:
    return "\n\n".join(f"[{name}]\n{text}" for name, text in outputs)


class Parallel:
    """Run branches at once on the same input; combine their outputs (by default, labelled)."""

    def __init__(
        self,
        *,
        name: str,
        branches: Sequence[AgentLike],
        combine: Callable[[Sequence[tuple[str, str]]], str] = _join_outputs,
    ) -> None:
        self.branches = _check_steps("Parallel", name, branches)
        self.name = name
        self.combine = combine

    def __repr__(self) -> str:
        return f"Parallel(name={self.name!r}, branches={[b.name for b in self.branches]})"

    async def run(self, ctx: RunContext) -> str:
        done = _finished_steps(ctx)
        outputs: dict[int, str] = {}
        stopped = False

        async def branch(index: int, step: AgentLike) -> None:
            nonlocal stopped
            key = f"{index}:{step.name}"
            path = f"{ctx.path}/{key}" if ctx.path else key
            if path in done:
                outputs[index] = done[path]
                return
            try:
                outputs[index] = await _run_step(ctx, key, step, ctx.input)
            except StopRequested:
                stopped = True  # let the other branches reach their own safe points

        ctx.check_stop()
        async with trio.open_nursery() as nursery:
            for index, step in enumerate(self.branches):
                nursery.start_soon(branch, index, step)
        if stopped:
            raise StopRequested
        return self.combine([(b.name, outputs[i]) for i, b in enumerate(self.branches)])


class Loop:
    """Run ``body`` repeatedly, feeding each output back as the next input.

    Stops after ``max_iterations``, or as soon as ``until(output)`` is true.
    """

    def __init__(
        self,
        *,
        name: str,
        body: AgentLike,
        max_iterations: int,
        until: Callable[[str], bool] | None = None,
    ) -> None:
        (self.body,) = _check_steps("Loop", name, [body])
        if not isinstance(max_iterations, int) or max_iterations < 1:
            raise UsageError(f"Loop {name!r}: max_iterations must be a positive int")
        self.name = name
        self.max_iterations = max_iterations
        self.until = until

    def __repr__(self) -> str:
        return f"Loop(name={self.name!r}, body={self.body.name!r}, max={self.max_iterations})"

    async def run(self, ctx: RunContext) -> str:
        done = _finished_steps(ctx)
        text = ctx.input
        for index in range(self.max_iterations):
            key = f"{index}:{self.body.name}"
            path = f"{ctx.path}/{key}" if ctx.path else key
            if path in done:
                text = done[path]
            else:
                ctx.check_stop()
                text = await _run_step(ctx, key, self.body, text)
            if self.until is not None and self.until(text):
                break
        return text
