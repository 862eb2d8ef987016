"""Lifecycle hooks: code of yours that the runner calls as an invocation lives and ends.

``Runner(hooks=[...], hook_timeout=5.0)`` takes objects with any subset of these async methods
(subclass :class:`Hooks`, whose methods do nothing, or write any object with the methods you
need).  Each method gets the invocation's :class:`InvocationInfo` first, then one record:

==========================  ==================================================================
``on_invocation_start``     the invocation is durable and its body is about to run (also on
                            a resume: ``info.resumed``)
``on_tool_start(call)``     a :class:`~trio_agents.ToolCall`'s intent is journaled; the tool
                            runs once the hook returns
``on_tool_end(result)``     a :class:`~trio_agents.ToolResult` is journaled, before the model
                            sees it - every recorded result, including calls answered without
                            running (declined, not started, unknown outcome after a crash),
                            so it can come without an ``on_tool_start``
``on_gate(request)``        an ``approval_requested`` event
                            (:class:`~trio_agents.events.ApprovalRequested`) is journaled;
                            the wait for the person begins once the hook returns
``on_model_start(call)``    a model turn is about to be requested (:class:`ModelCall`: the
                            turn, the workflow step's path, the model, the request); called
                            by the task that streams it, so a context variable set here
                            (e.g. :data:`outgoing_trace`) is seen by the model's HTTP request
``on_model_end(end)``       that model turn is over (:class:`ModelCallEnd`: the response, or
                            the error, or ``cut_off`` by a cancel); called exactly once after
                            each ``on_model_start``, in the same task, shielded, whatever
                            the ending - before the turn is journaled
``on_step_start(step)``     a workflow step (:class:`StepCall`: its path, its agent) is about
                            to run, in the task that runs it (a ``Parallel`` branch's own)
``on_step_end(end)``        that step is over (:class:`StepCallEnd`: its output once its
                            ``step_finished`` event is journaled, or the error, or
                            ``cut_off`` by a cancel, a stop at a safe point or a pause);
                            exactly once after each ``on_step_start``, in the same task,
                            shielded, whatever the ending
``on_record(event)``        every event this run journals durably (a turn, a tool call's
                            intent and result, a step's end, a gate's request and end),
                            inline, once it is stored and published, by the task that
                            recorded it (the gate ends a cancel journals with the terminal
                            event are not: see ``Outcome.gates``)
``on_event(event)``         every :class:`~trio_agents.events.Event` of this run, in id order,
                            deltas and the terminal event included: what
                            ``inv.events(after_seq=<where this run began>)`` yields
``on_invocation_end``       the :class:`~trio_agents.Outcome`, once the terminal event is
                            stored and published; a cancel shows as ``status == "cancelled"``
                            with ``reason`` and ``cancel_mode``
==========================  ==================================================================

Hooks are called in the order given, one after the other.  A hook observes; it cannot change
what the invocation does.

Who owns the calls
    The inline methods (``on_invocation_start``, ``on_model_start``, ``on_model_end``,
    ``on_step_start``, ``on_step_end``, ``on_tool_start``, ``on_tool_end``, ``on_gate``,
    ``on_record``) are awaited by the task
    that reached the point - the invocation's own task, or the tool call's task - inside the
    invocation's cancel scope.  ``on_invocation_start`` and ``on_invocation_end`` are awaited
    by the invocation's own task, whose context variables are a copy of those of the caller
    of ``start`` / ``resume``.  The durable write comes first (the recorder calls the hook
    after it stored and published the event), so a hook never sees something the journal
    does not hold.

    ``on_event`` is called by one follower task per invocation (only if some hook has
    ``on_event``), reading an :class:`~._stream.EventStream` over the invocation's live log.
    A slow hook costs a cursor, never memory: the log is bounded, and a follower that falls
    behind it reads the store.  The hot path (publishing a delta) never waits for a hook.
    The follower lives in a nursery that the invocation's task opens around its whole life,
    so it never outlives the invocation; ``wait()`` returns after it has finished.

    ``on_invocation_end`` is awaited in the invocation's shielded cleanup, after the terminal
    event is stored and published and after the follower has delivered it, and before
    ``wait()`` returns (and before the runner forgets the invocation).

What happens on cancel
    ``trio.Cancelled`` is never caught.  A cancel of the invocation cancels an inline hook that
    is running (it is inside the invocation's scope) and the invocation ends ``cancelled`` as it
    would without hooks.  The follower is outside that scope and shielded, so ``on_event``
    still sees the terminal event of a cancelled invocation, or of a runner shutting down; it
    is bounded instead by the deadline below.  ``on_invocation_end`` runs shielded, so it runs
    after any cancel, runner shutdown included.

Deadlines and failures
    Each call is bounded by ``hook_timeout`` (a ``trio.move_on_after``).  A hook that raises
    (an ``Exception``) or is cut off at its deadline is logged on the ``trio_agents.hooks``
    logger and reported as a ``warning`` event (:class:`~trio_agents.events.HookWarning`):
    the invocation carries on as if the hook had returned - a hook's failure never becomes a
    tool error or a failed invocation.  The event is ephemeral (published at once, stored with
    the next batch): it records nothing a resume needs.  Only the first failure of each hook
    method is published per invocation (every one is logged), so a hook that fails on every
    event cannot flood the stream or feed on its own warnings.  Once the ending is decided no
    event may follow the terminal one, so failures from then on (``on_invocation_end``, a
    late ``on_event``) are logged only.

    A hook object whose ``nonblocking`` attribute is true declares that its methods never
    wait (they reach no trio checkpoint: no I/O, no lock, no sleep).  The runner then calls
    them without a deadline scope, and ``on_model_end`` / ``on_step_end`` without a shield:
    a call that cannot block needs neither, and a traced run costs less (a scope per call is
    much of what a cheap hook costs).  Exceptions are still caught and reported as above; a
    hook that declares this and blocks anyway is not cut off at ``hook_timeout``.

    After the terminal event, the follower has ``hook_timeout`` more to catch up; a hook still
    behind then is cut off (logged) so ``wait()`` never hangs.  So ``wait()`` returns at most
    about ``2 * hook_timeout`` later than it would without hooks.

Trace context
    A hook object may also have a plain (not async) method ``trace_context(self) -> Mapping[str,
    str]``: the W3C trace context headers of the caller, asked in the caller's task when
    ``start`` or ``resume`` opens an invocation (the first non-empty answer wins; an
    exception there is logged and ignored).  Without one, the trace context of the request
    the server is serving (:data:`incoming_trace`) is taken.  A turn loop's turn takes the
    trace context of whoever sent the message it answers (asked in the task of
    ``loop.send``), else its loop's opener's.  Hooks get it as
    :attr:`InvocationInfo.caller_trace`.

    A hook object may also have a plain method ``run_trace(self, caller: Mapping[str, str])
    -> Mapping[str, str]``: the trace context of the run about to open, given its caller's -
    e.g. the span the hook starts for the run, so that the run's own context, not only its
    caller's, is known before anything is stored (the first non-empty answer wins; without
    one, the caller's is the run's).  The runner stores the run's context in the ``started``
    event before the run begins; hooks get it as :attr:`InvocationInfo.trace`, and a resumed
    run also gets the first run's as :attr:`InvocationInfo.first_trace` (to link to it).
    :data:`outgoing_trace` holds headers that the model adapters add to every model HTTP
    request made in the task (and the tasks it spawns).

Fewer events
    A hook object may have an ``event_kinds`` attribute, a collection of event ``kind``
    strings: its ``on_event`` and ``on_record`` are then called for those kinds only (most
    events are deltas; a hook that needs none saves a call for each).  ``on_record`` with
    ``event_kinds`` costs nothing for the other kinds, and needs no follower task.

Statistics
    What no single invocation sees is counted process-wide, for a hook (or anything) to read
    when it likes: :func:`lease_rounds` - the lease renewal rounds of all the runners of this
    process, how many were late or missed (:class:`LeaseRounds`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs
import trio

from ._exceptions import UsageError
from ._outcome import Outcome
from ._recorder import Recorder
from ._statistics import LeaseRounds, lease_rounds
from ._stream import EventStream
from ._tracecontext import incoming as incoming_trace
from ._tracecontext import outgoing as outgoing_trace
from .agents._context import AgentLike
from .events import (
    ApprovalRequested,
    ErrorInfo,
    Event,
    HookWarning,
    ToolCallFinished,
    ToolCallStarted,
)
from .messages import ModelRequest, ModelResponse, ToolCall, ToolResult
from .stores._base import Store

__all__ = [
    "HOOK_METHODS",
    "HookHost",
    "HookSet",
    "Hooks",
    "InvocationHooks",
    "InvocationInfo",
    "LeaseRounds",
    "ModelCall",
    "ModelCallEnd",
    "StepCall",
    "StepCallEnd",
    "incoming_trace",
    "lease_rounds",
    "outgoing_trace",
]

logger = logging.getLogger("trio_agents.hooks")

HOOK_METHODS: Final = (
    "on_invocation_start",
    "on_event",
    "on_model_start",
    "on_model_end",
    "on_step_start",
    "on_step_end",
    "on_tool_start",
    "on_tool_end",
    "on_gate",
    "on_record",
    "on_invocation_end",
)

_INLINE: Final[dict[type[Any], str]] = {
    ToolCallStarted: "on_tool_start",
    ToolCallFinished: "on_tool_end",
    ApprovalRequested: "on_gate",
}
"""Recorded events that call an inline hook method, and the record the method gets."""


@attrs.frozen(kw_only=True)
class InvocationInfo:
    """The invocation a hook is called for (every method gets it first)."""

    invocation_id: str
    agent: str
    input: str
    user_id: str | None = None
    session_id: str | None = None
    resumed: bool = False
    trace: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    """This run's W3C trace context, as its ``started`` event stores it: what a hook's
    ``run_trace`` made of the caller's, else the caller's (may be empty)."""
    caller_trace: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    """The trace context of whoever started this run (``start`` / ``resume``'s caller, the
    server's request, a turn loop's message's sender); may be empty."""
    first_trace: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    """The first run's ``trace``, as its ``started`` event stored it (a resumed run's link to
    the first run; on a first run, the same as ``trace``)."""


@attrs.frozen(kw_only=True)
class ModelCall:
    """One model turn about to be requested (``on_model_start``)."""

    turn: int
    path: str = ""
    """The workflow step the agent runs in (``""``: the top agent); see the events' ``path``."""
    model: str
    provider: str
    request: ModelRequest = attrs.field(eq=False, repr=False)


@attrs.frozen(kw_only=True)
class ModelCallEnd:
    """How a model turn ended (``on_model_end``): ``response`` when the stream finished;
    ``error`` (what the model raised: a :class:`~trio_agents.ModelError`, or any exception)
    when it failed; ``cut_off`` when a cancel stopped the stream (both ``None`` then)."""

    call: ModelCall
    response: ModelResponse | None = None
    error: BaseException | None = None
    cut_off: bool = False


@attrs.frozen(kw_only=True)
class StepCall:
    """A workflow step about to run (``on_step_start``)."""

    path: str
    """The step's path, as its events carry it (``"0:research"``, ``"1:review/0:draft"``)."""
    agent: str
    """The name of the step's agent (or workflow)."""


@attrs.frozen(kw_only=True)
class StepCallEnd:
    """How a workflow step ended (``on_step_end``): ``output`` when it finished (its
    ``step_finished`` event is journaled); ``error`` when it failed; ``cut_off`` when a
    cancel, a stop at a safe point or a pause ended it (both ``None`` then)."""

    step: StepCall
    output: str | None = None
    error: BaseException | None = None
    cut_off: bool = False


class Hooks:
    """Lifecycle hooks with methods that do nothing: override the ones you need.

    Any object with some of these async methods will do as well.  See :mod:`trio_agents.hooks`
    for when each is called, what a cancel does to it, and its deadline.
    """

    async def on_invocation_start(self, inv: InvocationInfo) -> None:
        """The invocation is durable and about to run (or resume)."""

    async def on_event(self, inv: InvocationInfo, event: Event) -> None:
        """Each event of this run, in order (deltas and the terminal event included)."""

    async def on_model_start(self, inv: InvocationInfo, call: ModelCall) -> None:
        """A model turn is about to be requested, in the task that streams it."""

    async def on_model_end(self, inv: InvocationInfo, end: ModelCallEnd) -> None:
        """The model turn of the last ``on_model_start`` is over (same task, shielded)."""

    async def on_step_start(self, inv: InvocationInfo, step: StepCall) -> None:
        """A workflow step is about to run, in the task that runs it."""

    async def on_step_end(self, inv: InvocationInfo, end: StepCallEnd) -> None:
        """The step of the last ``on_step_start`` of this task is over (same task, shielded)."""

    async def on_tool_start(self, inv: InvocationInfo, call: ToolCall) -> None:
        """A tool call's intent is journaled; the tool runs when this returns."""

    async def on_tool_end(self, inv: InvocationInfo, result: ToolResult) -> None:
        """A tool result is journaled, before the model sees it."""

    async def on_gate(self, inv: InvocationInfo, request: ApprovalRequested) -> None:
        """A tool call waits for a person's approval (``request.approval_id``)."""

    async def on_record(self, inv: InvocationInfo, event: Event) -> None:
        """An event this run journaled durably, inline, once stored and published."""

    async def on_invocation_end(self, inv: InvocationInfo, outcome: Outcome) -> None:
        """The invocation ended; its terminal event is stored and published."""


HookMethod = Callable[..., Awaitable[None]]


def _hook_name(hook: object) -> str:
    name = getattr(hook, "name", None)
    return name if isinstance(name, str) and name else type(hook).__name__


def _methods_of(hook: object) -> dict[str, HookMethod]:
    """The hook methods ``hook`` implements (a :class:`Hooks` default is not one); raise
    :class:`UsageError` for a sync method or an object with none."""
    found: dict[str, HookMethod] = {}
    for name in HOOK_METHODS:
        method = getattr(hook, name, None)
        if method is None:
            continue
        if isinstance(hook, Hooks) and getattr(type(hook), name, None) is getattr(Hooks, name):
            continue  # the default: nothing to call
        if not inspect.iscoroutinefunction(method):
            raise UsageError(
                f"hook {_hook_name(hook)!r}: {name} must be an async method (`async def "
                f"{name}(self, ...)`), got {method!r}"
            )
        found[name] = method
    if not found and not isinstance(hook, Hooks):
        raise UsageError(
            f"{hook!r} is not a hook: it has none of the hook methods "
            f"({', '.join(HOOK_METHODS)}); subclass trio_agents.Hooks and override some"
        )
    return found


class HookHost(Protocol):
    """What a bound hook set needs from its invocation."""

    @property
    def id(self) -> str: ...

    @property
    def agent(self) -> AgentLike: ...

    @property
    def input(self) -> str: ...

    @property
    def user_id(self) -> str | None: ...

    @property
    def session_id(self) -> str | None: ...

    @property
    def resumed(self) -> bool: ...

    @property
    def recorder(self) -> Recorder: ...

    @property
    def _ending(self) -> bool:
        """The ending is decided: no event may be published but the terminal one."""
        ...


class HookSet:
    """A runner's hooks, checked once; :meth:`bind` makes each invocation's
    :class:`InvocationHooks`."""

    __slots__ = (
        "by_method",
        "event_kinds",
        "nonblocking",
        "run_tracers",
        "shieldless",
        "timeout",
        "tracers",
    )

    def __init__(self, hooks: Sequence[object], *, timeout: float) -> None:
        if isinstance(hooks, (str, bytes)) or not isinstance(hooks, (list, tuple)):
            raise UsageError(f"hooks must be a list of hook objects, got {hooks!r}")
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise UsageError(f"hook_timeout must be positive seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.by_method: dict[str, list[tuple[str, HookMethod]]] = {}
        self.tracers: list[tuple[str, Callable[[], Mapping[str, str]]]] = []
        self.run_tracers: list[tuple[str, Callable[[Mapping[str, str]], Mapping[str, str]]]] = []
        self.event_kinds: dict[HookMethod, frozenset[str]] = {}  # on_event methods filtered
        self.nonblocking: set[HookMethod] = set()  # called without a deadline scope
        for hook in hooks:
            for name, method in _methods_of(hook).items():
                self.by_method.setdefault(name, []).append((_hook_name(hook), method))
                if getattr(hook, "nonblocking", False) is True:
                    self.nonblocking.add(method)
            kinds = getattr(hook, "event_kinds", None)
            methods = _methods_of(hook)
            if kinds is not None and ("on_event" in methods or "on_record" in methods):
                if isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds):
                    raise UsageError(
                        f"hook {_hook_name(hook)!r}: event_kinds must be a collection of event "
                        f"kinds (e.g. {{'approval_decided', 'ended'}}), got {kinds!r}"
                    )
                for name in ("on_event", "on_record"):
                    if name in methods:
                        self.event_kinds[methods[name]] = frozenset(kinds)
            tracer = getattr(hook, "trace_context", None)
            if tracer is not None:
                if not callable(tracer) or inspect.iscoroutinefunction(tracer):
                    raise UsageError(
                        f"hook {_hook_name(hook)!r}: trace_context must be a plain method "
                        f"returning the caller's trace context headers, got {tracer!r}"
                    )
                self.tracers.append((_hook_name(hook), tracer))
            run_tracer = getattr(hook, "run_trace", None)
            if run_tracer is not None:
                if not callable(run_tracer) or inspect.iscoroutinefunction(run_tracer):
                    raise UsageError(
                        f"hook {_hook_name(hook)!r}: run_trace must be a plain method "
                        f"returning the run's trace context headers, got {run_tracer!r}"
                    )
                self.run_tracers.append((_hook_name(hook), run_tracer))

        # Methods whose every hook is nonblocking: their ends are called without a shield.
        self.shieldless = frozenset(
            name
            for name, found in self.by_method.items()
            if all(fn in self.nonblocking for _, fn in found)
        )

    def trace_context(self) -> Mapping[str, str]:
        """The caller's trace context (see the module docstring): ask the hooks that have
        ``trace_context``, in order; else the server's incoming request's."""
        for name, tracer in self.tracers:
            try:
                found = tracer()
            except Exception:
                logger.warning("hook %s.trace_context raised; ignored", name, exc_info=True)
                continue
            if found:
                return dict(found)
        return incoming_trace.get()

    def run_trace(self, caller: Mapping[str, str]) -> dict[str, str]:
        """The trace context of a run whose caller's is ``caller`` (see the module
        docstring): ask the hooks that have ``run_trace``, in order; else ``caller``."""
        for name, tracer in self.run_tracers:
            try:
                found = tracer(caller)
            except Exception:
                logger.warning("hook %s.run_trace raised; ignored", name, exc_info=True)
                continue
            if found:
                return dict(found)
        return dict(caller)

    @classmethod
    def of(cls, hooks: Sequence[object], *, timeout: float) -> HookSet | None:
        """The checked set, or ``None`` when no hook has a method to call (the runner then
        makes nothing per invocation)."""
        found = cls(hooks, timeout=timeout)
        return found if found.by_method or found.tracers or found.run_tracers else None

    def bind(self, host: HookHost, store: Store) -> InvocationHooks:
        """The hooks of the invocation ``host``, whose events are in ``store``."""
        return InvocationHooks(self, host, store)


class InvocationHooks:
    """One invocation's hook calls.  See the module docstring."""

    __slots__ = (
        "_done",
        "_event_kinds",
        "_follower",
        "_host",
        "_info",
        "_methods",
        "_nonblocking",
        "_shieldless",
        "_store",
        "_timeout",
        "_warned",
    )

    def __init__(self, hooks: HookSet, host: HookHost, store: Store) -> None:
        self._host = host
        self._store = store
        self._methods = hooks.by_method
        self._timeout = hooks.timeout
        self._event_kinds = hooks.event_kinds
        self._nonblocking = hooks.nonblocking
        self._shieldless = hooks.shieldless
        self._info = InvocationInfo(
            invocation_id=host.id,
            agent=host.agent.name,
            input=host.input,
            user_id=host.user_id,
            session_id=host.session_id,
            resumed=host.resumed,
        )
        self._warned: set[tuple[str, str]] = set()
        self._follower: trio.CancelScope | None = None
        self._done: trio.Event | None = None
        if "on_record" in self._methods or any(m in self._methods for m in _INLINE.values()):
            host.recorder.on_recorded = self._recorded

    # ---- the invocation's side ------------------------------------------------------------

    def follows_events(self) -> bool:
        """Some hook has ``on_event``: the invocation's task runs through :meth:`run`."""
        return "on_event" in self._methods

    async def run(self, main: Callable[[], Awaitable[None]]) -> None:
        """Run ``main`` (the invocation's life, ending included) in this task, with the
        ``on_event`` follower beside it if some hook has ``on_event``."""
        if "on_event" not in self._methods:
            await main()
            return
        follower = self._follower = trio.CancelScope(shield=True)
        done = self._done = trio.Event()
        async with trio.open_nursery() as nursery:
            name = f"hooks on_event {self._info.invocation_id}"
            nursery.start_soon(self._follow, follower, done, name=name)
            try:
                await main()
            finally:
                follower.cancel()  # it has delivered the end already, unless main() broke

    def traced(
        self, trace: Mapping[str, str], caller: Mapping[str, str], first_trace: Mapping[str, str]
    ) -> None:
        """The run's trace context is known (the invocation is being opened)."""
        self._info = attrs.evolve(
            self._info, trace=trace, caller_trace=caller, first_trace=first_trace
        )

    async def started(self) -> None:
        await self._call_all("on_invocation_start")

    def wants_model_calls(self) -> bool:
        return "on_model_start" in self._methods or "on_model_end" in self._methods

    async def model_started(self, call: ModelCall) -> None:
        await self._call_all("on_model_start", call)

    async def model_ended(self, end: ModelCallEnd) -> None:
        """Whatever ended the model turn: shielded, unless every hook is nonblocking."""
        await self._call_shielded("on_model_end", end)

    def wants_steps(self) -> bool:
        return "on_step_start" in self._methods or "on_step_end" in self._methods

    async def step_started(self, step: StepCall) -> None:
        await self._call_all("on_step_start", step)

    async def step_ended(self, end: StepCallEnd) -> None:
        """Whatever ended the step: shielded, unless every hook is nonblocking."""
        await self._call_shielded("on_step_end", end)

    async def ended(self, outcome: Outcome) -> None:
        """Let the follower deliver the terminal event, then call ``on_invocation_end``.
        Call it shielded, once the terminal event is published."""
        if self._follower is not None and self._done is not None:
            with trio.move_on_after(self._timeout):
                await self._done.wait()
            if not self._done.is_set():
                logger.warning(
                    "on_event hooks of invocation %s had not caught up %gs after its end; cut off",
                    self._info.invocation_id,
                    self._timeout,
                )
                self._follower.cancel()
                await self._done.wait()
        await self._call_all("on_invocation_end", outcome)

    async def _recorded(self, event: Event) -> None:
        for name, fn in self._methods.get("on_record", ()):
            kinds = self._event_kinds.get(fn)
            if kinds is None or event.kind in kinds:
                await self._call(name, "on_record", fn, (event,))
        method = _INLINE.get(type(event))
        if method is None or method not in self._methods:
            return
        if isinstance(event, ToolCallStarted):
            await self._call_all(method, event.call)
        elif isinstance(event, ToolCallFinished):
            await self._call_all(method, event.result)
        else:
            await self._call_all(method, event)

    # ---- calls ------------------------------------------------------------------------------

    async def _follow(self, scope: trio.CancelScope, done: trio.Event) -> None:
        rec = self._host.recorder
        try:
            with scope:
                stream = EventStream(self._store, self._info.invocation_id, rec.origin, live=rec)
                try:
                    followers = [
                        (name, fn, self._event_kinds.get(fn))
                        for name, fn in self._methods.get("on_event", ())
                    ]
                    async for event in stream:
                        for name, fn, kinds in followers:
                            if kinds is None or event.kind in kinds:
                                await self._call(name, "on_event", fn, (event,))
                except Exception as exc:  # the store could not be read: stop following
                    why = f"on_event stopped: the events could not be read: {type(exc).__name__}"
                    self._failed("*", "on_event", exc, message=f"{why}: {exc}")
        finally:
            done.set()

    async def _call_all(self, method: str, *args: Any) -> None:
        for name, fn in self._methods.get(method, ()):
            await self._call(name, method, fn, args)

    async def _call_shielded(self, method: str, *args: Any) -> None:
        if method in self._shieldless or method not in self._methods:
            await self._call_all(method, *args)  # they cannot see a cancel: no scope
            return
        with trio.CancelScope(shield=True):
            await self._call_all(method, *args)

    async def _call(self, name: str, method: str, fn: HookMethod, args: tuple[Any, ...]) -> None:
        if fn in self._nonblocking:  # it cannot block: no deadline scope (see the docstring)
            try:
                await fn(self._info, *args)
            except Exception as exc:  # trio.Cancelled is a BaseException: it passes
                self._failed(name, method, exc)
            return
        with trio.move_on_after(self._timeout) as deadline:
            try:
                await fn(self._info, *args)
            except Exception as exc:  # trio.Cancelled is a BaseException: it passes
                self._failed(name, method, exc)
                return
        if deadline.cancelled_caught:
            self._failed(name, method, None)

    def _failed(
        self, name: str, method: str, exc: Exception | None, *, message: str | None = None
    ) -> None:
        inv_id = self._info.invocation_id
        if exc is None:
            message = f"hook {name}.{method} did not return within {self._timeout:g}s; cut off"
            logger.warning("%s (invocation %s)", message, inv_id)
        else:
            message = message or f"hook {name}.{method} raised {type(exc).__name__}: {exc}"
            logger.warning("%s (invocation %s)", message, inv_id, exc_info=exc)
        rec = self._host.recorder
        if (name, method) in self._warned or self._host._ending or rec.closed:
            return
        self._warned.add((name, method))
        rec.publish_ephemeral(
            HookWarning,
            hook=name,
            method=method,
            message=message,
            error=ErrorInfo.from_exception(exc) if exc is not None else None,
            timed_out=exc is None,
        )
