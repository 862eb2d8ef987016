"""The model <-> tool loop of one agent.

One turn: stream the model's answer (deltas are published as they arrive), journal the finished
turn, then run its tool calls in a nursery - in parallel, each journaled as an intent before it
runs and as a result after.  The loop ends when the model answers without tool calls.

Everything the loop starts lives inside the invocation's cancel scope: cancelling it closes the
model's stream (the server sees the disconnect) and delivers ``trio.Cancelled`` to every running
tool.  Safe points (between turns, after tools) are where ``after_turn`` / ``after_tools``
cancels take effect.

Tools declared ``requires_approval=True`` wait for a person: the turn's approvals are asked
for (journaled, published as ``approval_requested``) and end before any of its calls runs; a
call whose approval did not end ``approved`` (denied, expired, cancelled) never runs and the
model is told why; an approval with edited arguments runs the call with those.  A
``long_running`` tool's handle is journaled and the call waits for its result; a tool that
raises :class:`~trio_agents.NeedsCredential` waits for the credential and runs again.  Every
such wait (a gate, see :mod:`trio_agents.approvals`) ends with any cancel, and with a pause
when the runner's ``approval_timeout`` passes.

Call ids: a model turn whose calls carry an empty or repeated id (some OpenAI-compatible
servers send them) gets unique, deterministic ids (``call_<turn>_<index>``) before the turn is
journaled, so the transcript, the results sent back, the gates and a resume all agree.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeAlias

import attrs
import trio

from .._exceptions import MaxTurnsExceeded, NeedsCredential, StoreError, UsageError
from ..messages import ModelRequest, ModelResponse, ToolCall, ToolResult
from ..models._base import Model, ReasoningChunk, TextChunk
from ..tools import InputAnswer, Tool, ToolContext, Toolset, tool
from ._context import ApprovalAnswer, GateSpec, RunContext, StopRequested, input_answer
from ._transcript import Transcript

__all__ = ["Agent"]

AnyTool: TypeAlias = Tool[..., Any]

UNKNOWN_OUTCOME = (
    "unknown outcome: this call of tool {name!r} was started before the process running it "
    "stopped, so whether it took effect is unknown. It was not run again because the tool is "
    "not declared idempotent. Check its effect before calling it again."
)


NOT_RUN = (
    "not run: this call of tool {name!r} was not started because the invocation was asked to "
    "stop before it began."
)


NOT_APPROVED = (
    "not approved: this call of tool {name!r} was not run because a person declined it"
    "{reason}. Do not call it again unless asked to."
)


APPROVAL_EXPIRED = (
    "expired: this call of tool {name!r} was not run because no one approved it in time. "
    "Do not call it again unless asked to."
)


APPROVAL_CANCELLED = (
    "cancelled: this call of tool {name!r} was not run because the invocation was cancelled "
    "while it waited for approval."
)


NO_CREDENTIAL = (
    "no credential: this call of tool {name!r} needed credential {credential!r}, which was "
    "not given ({state})."
)


def unique_call_ids(response: ModelResponse, turn: int) -> ModelResponse:
    """``response`` with an empty or repeated tool call id replaced by ``call_<turn>_<index>``
    (made unique if the model used that too); unchanged when every id is unique."""
    calls = response.message.tool_calls
    taken = {c.id for c in calls}
    seen: set[str] = set()
    fixed: list[ToolCall] = []
    for index, call in enumerate(calls):
        call_id = call.id
        if not call_id or call_id in seen:
            call_id = f"call_{turn}_{index}"
            while call_id in taken or call_id in seen:
                call_id += "_"
            call = attrs.evolve(call, id=call_id)
        seen.add(call_id)
        fixed.append(call)
    if fixed == list(calls):
        return response
    message = attrs.evolve(response.message, tool_calls=tuple(fixed))
    return attrs.evolve(response, message=message)


def _as_tool(item: AnyTool | Callable[..., Any], agent: str) -> AnyTool:
    if isinstance(item, Tool):
        return item
    if callable(item):
        return tool(item)
    raise UsageError(f"agent {agent!r}: {item!r} is not a tool (decorate a function with @tool)")


def _not_done(calls: Iterable[ToolCall], results: Mapping[str, ToolResult]) -> list[ToolCall]:
    # A function, not a comprehension in run(): that would keep a cell per parked invocation.
    return [c for c in calls if c.id not in results]


class Agent:
    """An LLM agent: a model, instructions, and tools it may call.

    Construction checks the configuration and raises :class:`~trio_agents.UsageError` naming
    the problem: no model, a model that is not a :class:`~trio_agents.models.Model`, a tool
    without annotations, two tools with one name, ``max_turns < 1``.
    """

    def __init__(
        self,
        *,
        name: str,
        model: Model | None,
        instructions: str = "",
        tools: Iterable[AnyTool | Toolset | Callable[..., Any]] = (),
        max_turns: int = 10,
        max_tokens: int | None = None,
        temperature: float | None = None,
        description: str = "",
    ) -> None:
        if not isinstance(name, str) or not name:
            raise UsageError(f"an agent needs a non-empty name, got {name!r}")
        if model is None:
            raise UsageError(
                f"agent {name!r} has no model; pass model=... (e.g. models.OpenAIChat)"
            )
        if not isinstance(model, Model):
            raise UsageError(
                f"agent {name!r}: model {model!r} is not a model (it needs name, provider, "
                "stream(request), and __aenter__/__aexit__: a model is an async context manager)"
            )
        if not isinstance(tools, (list, tuple)):
            raise UsageError(f"agent {name!r}: tools must be a list of tools, got {tools!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise UsageError(f"agent {name!r}: max_turns must be a positive int, got {max_turns!r}")
        by_name: dict[str, AnyTool] = {}
        toolsets: list[Toolset] = []
        for item in tools:
            if isinstance(item, Toolset):  # its tools are known once the runner serves it
                toolsets.append(item)
                continue
            t = _as_tool(item, name)
            if t.name in by_name:
                raise UsageError(
                    f"agent {name!r} has two tools named {t.name!r}; names must be unique"
                )
            by_name[t.name] = t
        self.name = name
        self.model = model
        self.instructions = instructions
        self.description = description
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._own_tools = by_name
        self.toolsets: tuple[Toolset, ...] = tuple(toolsets)

    @property
    def _tools(self) -> Mapping[str, AnyTool]:
        """The agent's own tools and those its toolsets serve now.

        Raises :class:`~trio_agents.UsageError` when a toolset is not served (the runner serves
        them) or a toolset's tool has the name of another tool."""
        if not self.toolsets:
            return self._own_tools
        merged = dict(self._own_tools)
        for toolset in self.toolsets:
            for tool_name, found in toolset.current_tools().items():
                if tool_name in merged:
                    raise UsageError(
                        f"agent {self.name!r}: {toolset.name!r} serves a tool named "
                        f"{tool_name!r}, and the agent has another; give the toolset a prefix"
                    )
                merged[tool_name] = found
        return merged

    def __repr__(self) -> str:
        tools = [*self._own_tools, *(t.name for t in self.toolsets)]
        return f"Agent(name={self.name!r}, model={self.model.name!r}, tools={tools})"

    @property
    def tools(self) -> Mapping[str, AnyTool]:
        return dict(self._tools)

    async def run(self, ctx: RunContext) -> str:
        """Run (or resume) the loop in ``ctx``; return the final answer.

        Raises :class:`StopRequested` at a safe point when a safe-point cancel is due,
        :class:`~trio_agents.MaxTurnsExceeded`, or the model's
        :class:`~trio_agents.ModelError`.  ``trio.Cancelled`` passes through untouched.
        """
        transcript = Transcript.replay(ctx.input, ctx.journal, ctx.path, ctx.history)
        while True:
            last = transcript.last
            if last is not None:
                if not last.tool_calls:
                    return last.text
                missing = _not_done(last.tool_calls, transcript.results)
                if missing:
                    # The approvals are awaited here, not in _run_tools: one frame less for
                    # an invocation parked on them (it holds its whole chain of frames).
                    asking = self._ask_approvals(ctx, transcript, missing)
                    answers = await asking if asking is not None else {}
                    await self._run_tools(ctx, transcript, missing, answers)
                transcript.close_turn()
            ctx.check_stop()
            if transcript.turns >= self.max_turns:
                raise MaxTurnsExceeded(
                    f"agent {self.name!r} used all {self.max_turns} turns without a final answer"
                )
            await self._model_turn(ctx, transcript)

    async def _model_turn(self, ctx: RunContext, transcript: Transcript) -> None:
        turn = transcript.turns + 1
        request = ModelRequest(
            instructions=self.instructions,
            messages=tuple(transcript.messages),
            tools=tuple(t.spec for t in self._tools.values()),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )
        async with (
            ctx.model_call(turn, self.model, request) as call,  # the stream scope, and hooks
            self.model.stream(request) as stream,
        ):
            async for chunk in stream:
                if isinstance(chunk, TextChunk):
                    ctx.emit_text(turn, chunk.text)
                elif isinstance(chunk, ReasoningChunk):
                    ctx.emit_reasoning(turn, chunk.text)
                else:
                    continue
                # A store slower than the model: stop reading (TCP back-pressure) until the
                # deltas published so far are taken.
                await ctx.room()
            response = call.response = stream.response
        if call.scope.cancelled_caught:
            raise StopRequested
        response = unique_call_ids(response, turn)
        await ctx.record_turn(turn, response)
        transcript.add_turn(response.message, response.usage, turn=turn)

    def _ask_approvals(
        self, ctx: RunContext, transcript: Transcript, calls: list[ToolCall]
    ) -> Awaitable[Mapping[str, ApprovalAnswer]] | None:
        """The wait for the approvals of ``calls`` that need one (``None`` if none does).

        Calls that need a person's approval get it first, all of them, before any call of
        the turn runs: a wait that ends in a pause then leaves nothing half-done.  A call
        journaled as started was approved before."""
        gated = [
            c
            for c in calls
            if (t := self._tools.get(c.name)) is not None
            and t.requires_approval
            and c.id not in transcript.intents
        ]
        if not gated:
            return None
        specs = {c.id: self._spec(c) for c in gated}
        return ctx.await_approvals(transcript.turns, gated, specs)

    async def _run_tools(
        self,
        ctx: RunContext,
        transcript: Transcript,
        calls: list[ToolCall],
        answers: Mapping[str, ApprovalAnswer],
    ) -> None:
        async with trio.open_nursery() as nursery:
            for call in calls:
                nursery.start_soon(self._run_one, ctx, transcript, call, answers.get(call.id))
        if any(c.id not in transcript.results for c in calls):
            ctx.check_stop()  # a call was not started: the stop that prevented it is due

    def _spec(self, call: ToolCall) -> GateSpec:
        found = self._tools.get(call.name)
        if found is None:
            return GateSpec()
        return GateSpec(
            description=found.description,
            prompt=found.approval_prompt,
            expires_after=found.approval_expires_after,
        )

    async def _run_one(
        self,
        ctx: RunContext,
        transcript: Transcript,
        call: ToolCall,
        answer: ApprovalAnswer | None,
    ) -> None:
        turn = transcript.turns
        found = self._tools.get(call.name)
        attempt = transcript.intents.get(call.id, 0) + 1
        call = transcript.started.get(call.id, call)  # as started: maybe with edited arguments
        if answer is not None and answer.arguments is not None:
            call = attrs.evolve(call, arguments=answer.arguments)
        if attempt > 1:  # an earlier run was cut off: its requests for input died with it
            await ctx.end_stale_inputs(turn, call)
        if answer is not None and not answer.approved:
            text = {"expired": APPROVAL_EXPIRED, "cancelled": APPROVAL_CANCELLED}.get(
                answer.state, NOT_APPROVED
            )
            result = ToolResult(
                call_id=call.id,
                name=call.name,
                content=text.format(
                    name=call.name, reason=f": {answer.reason}" if answer.reason else ""
                ),
                is_error=True,
            )
        elif found is not None and found.long_running and call.id in transcript.awaiting:
            # Its function ran and its handle is journaled: only the result is still due.
            result = await ctx.await_result(turn, call, None, self._spec(call))
        elif attempt > 1 and (found is None or not found.idempotent):
            result = ToolResult(
                call_id=call.id,
                name=call.name,
                content=UNKNOWN_OUTCOME.format(name=call.name),
                is_error=True,
            )
        else:
            if not ctx.may_start_tool():  # after_tools / immediate took effect: start nothing
                return
            await ctx.record_tool_started(turn, call)
            if not ctx.may_start_tool():  # ... while the intent was being journaled
                # The intent is stored, the tool will not run: journal that it did not, also
                # under an immediate cancel (shielded), so that a resume never tells the model
                # that a call which never began has an unknown outcome.  If the store fails
                # here, a resume says "unknown outcome": the safe side.
                result = ToolResult(
                    call_id=call.id,
                    name=call.name,
                    content=NOT_RUN.format(name=call.name),
                    is_error=True,
                )
                with trio.CancelScope(shield=True), contextlib.suppress(StoreError):
                    await ctx.record_tool_finished(turn, result)
                    transcript.results[call.id] = result
                await trio.lowlevel.checkpoint_if_cancelled()
                return
            if found is None:
                known = ", ".join(sorted(self._tools)) or "none"
                result = ToolResult(
                    call_id=call.id,
                    name=call.name,
                    content=f"unknown tool {call.name!r}; the tools are: {known}",
                    is_error=True,
                )
            else:
                result = await self._call(ctx, found, call, turn, attempt)
        await ctx.record_tool_finished(turn, result)
        transcript.results[call.id] = result

    async def _ask_input(
        self, ctx: RunContext, turn: int, call: ToolCall, message: str, schema: Mapping[str, Any]
    ) -> InputAnswer:
        """A running tool asks a person for input (an MCP elicitation): an ``input`` gate."""
        end = await ctx.await_input(turn, call, message, schema, self._spec(call))
        action, content = input_answer(end)
        return InputAnswer(action=action or "cancel", content=content, state=end.state)

    async def _call(
        self, ctx: RunContext, found: AnyTool, call: ToolCall, turn: int, attempt: int
    ) -> ToolResult:
        """Run the tool (its intent is journaled); wait at its gates: a credential it asks
        for (then it runs again, under a new intent), a long-running call's result."""
        while True:
            context = ToolContext(
                invocation_id=ctx.invocation_id,
                call_id=call.id,
                tool_name=call.name,
                idempotency_key=f"{ctx.invocation_id}:{call.id}",
                attempt=attempt,
                user_id=ctx.user_id,
                credentials=ctx.credentials(),
                progress=functools.partial(ctx.emit_tool_progress, turn, call),
                ask_input=functools.partial(self._ask_input, ctx, turn, call),
            )
            try:
                result = await found.call(call, context)
            except NeedsCredential as need:
                given = await ctx.await_credential(
                    turn, call, need.name, need.hint, need.scopes, self._spec(call)
                )
                if given is None or need.name not in given:
                    state = "expired or cancelled" if given is None else "it was not received"
                    return ToolResult(
                        call_id=call.id,
                        name=call.name,
                        content=NO_CREDENTIAL.format(
                            name=call.name, credential=need.name, state=state
                        ),
                        is_error=True,
                    )
                await ctx.record_tool_started(turn, call)
                continue
            if found.long_running and not result.is_error:
                return await ctx.await_result(turn, call, result, self._spec(call))
            return result
