"""OpenTelemetry traces and metrics, following the GenAI semantic conventions - built on the
lifecycle hooks (:mod:`trio_agents.hooks`) and nothing else of the engine.

Off unless configured: nothing here runs unless you pass the hooks to a runner
(``Runner(hooks=[ta.otel.OTelHooks()])``, or ``trio-agents serve --otel``).  This module needs
``opentelemetry-api`` only; :func:`configure` (the SDK and its exporters, set up from the
standard ``OTEL_*`` variables) needs the extra: ``pip install 'trio-agents[otel]'``.

Spans (see ``docs/guide-observability.md`` for every attribute)

``invoke_agent {agent}``
    one per run of an invocation, the child of whoever started it (the caller's current span,
    the server's request, a turn loop's message's sender).  It is started before the run's
    ``started`` event is stored (``run_trace``), and that event keeps its context: a resume
    (a new run, in any process) *links* to the first run's ``invoke_agent`` span, whether or
    not the first run had a caller.
``step {key}`` (``trio_agents.step``: the step's path)
    a workflow step (``Sequential`` / ``Parallel`` / ``Loop``): the parent of what runs in
    it, from the step's start to its end (``on_step_start`` / ``on_step_end``).
``chat {model}``
    one per model turn: request and response model, token usage, finish reasons, the
    provider's request id.  Its W3C ``traceparent`` is sent with the model's HTTP request.
``execute_tool {tool}``
    one per tool call; the current span while the tool runs (its own calls are children).
    Its ``traceparent`` goes with the tool's calls to other services: an A2A
    :class:`~trio_agents.a2a.RemoteAgent` sends it as a header, and the MCP SDK puts the
    current span in each request's ``_meta`` (SEP-414).
``await_approval {tool}``
    a tool call's wait for a person: its end state (``approved``, ``denied``, ``expired``,
    ``cancelled``, or ``pending`` when the invocation paused) and who decided.

Endings: a failure sets status ERROR and ``error.type``; a cancel sets no error status (a
caller's intentional cancel is not an error, as in the HTTP conventions) and says how with
``trio_agents.cancel.mode``, ``.reason``, ``.by``, and ``trio_agents.finish_reason =
"cancelled"`` (the GenAI ``gen_ai.agent.finish_reason`` is proposed, not merged: rename the
key with ``finish_reason_key=``).  Every span is ended, whatever the ending: what is still open
when the invocation ends (a tool cut off by a cancel, a gate closed by it) is ended then, in
``on_invocation_end``, which runs shielded.  No span is held across a ``yield``: spans are
plain records kept per invocation, and a context is attached only around a tool call or a
model call, in the task that runs it, and detached in that same task.

Metrics: ``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``,
``gen_ai.invoke_agent.duration``, ``gen_ai.execute_tool.duration``, and ours:
``trio_agents.cancel.duration`` (from the first cancel request to the stopped invocation,
its terminal event stored), ``trio_agents.invocations.running`` and
``trio_agents.invocations.parked`` (observed when the metrics are collected: nothing is
counted per run), ``trio_agents.journal.write.duration`` (a tool call's intent, from its stamp
to its durable write), ``trio_agents.lease.renewals.late`` (the process's lease renewal
rounds answered late or missed, :func:`trio_agents.hooks.lease_rounds`, observed at
collection) and ``trio_agents.lease.stops`` (invocations that stopped themselves for their
lease).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs
import trio
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ._otel_setup import Telemetry, configure
from ._outcome import Outcome
from ._tracecontext import incoming as incoming_trace
from ._tracecontext import outgoing as outgoing_trace
from .events import ApprovalDecided, ApprovalRequested, Event, ToolCallStarted
from .hooks import (
    Hooks,
    InvocationInfo,
    ModelCall,
    ModelCallEnd,
    StepCall,
    StepCallEnd,
    lease_rounds,
)
from .messages import ToolCall, ToolResult

__all__ = ["OTelHooks", "Telemetry", "configure"]

SCOPE: Final = "trio_agents"

CANCEL_MODE: Final = "trio_agents.cancel.mode"
CANCEL_REASON: Final = "trio_agents.cancel.reason"
CANCEL_BY: Final = "trio_agents.cancel.by"
FINISH_REASON: Final = "trio_agents.finish_reason"

_PROPAGATOR: Final = TraceContextTextMapPropagator()
_JOURNAL: Final = {"trio_agents.event.kind": "tool_call_started"}
_TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
_OPENING_KEPT: Final = 4096
"""invoke_agent spans started by run_trace whose run has not started yet: more means runs
failed to open (their store write failed) - the oldest is ended."""
_SECOND_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)


def _ns(at: float) -> int:
    return int(at * 1e9)


def _carrier(span: Span) -> dict[str, str]:
    """W3C headers naming ``span`` as the parent: what the W3C propagator's ``inject`` writes,
    without the context it would build to find the span."""
    found = span.get_span_context()
    carrier = {
        "traceparent": f"00-{found.trace_id:032x}-{found.span_id:016x}-{found.trace_flags:02x}"
    }
    if found.trace_state:
        carrier["tracestate"] = found.trace_state.to_header()
    return carrier


def _parent(carrier: Mapping[str, str]) -> otel_context.Context | None:
    if not carrier:
        return None
    found = _PROPAGATOR.extract(dict(carrier))
    return found if trace.get_current_span(found).get_span_context().is_valid else None


@attrs.define
class _Attached:
    """A context attached in one task (detached only there)."""

    task: object
    token: object
    headers: contextvars.Token[Mapping[str, str]] | None = None


@attrs.define
class _Run:
    """One invocation's open spans."""

    info: InvocationInfo
    span: Span
    context: otel_context.Context  # the span's: the parent of the run's own spans
    started: float  # perf_counter
    attached: _Attached | None = None
    steps: dict[str, Span] = attrs.field(factory=dict)
    step_attached: dict[str, _Attached] = attrs.field(factory=dict)
    chats: dict[tuple[str, int], tuple[Span, float, _Attached | None]] = attrs.field(factory=dict)
    call_paths: dict[str, str] = attrs.field(factory=dict)  # tool call id -> its step path
    tools: dict[str, tuple[Span, float, _Attached | None]] = attrs.field(factory=dict)
    gates: dict[str, Span] = attrs.field(factory=dict)


class OTelHooks(Hooks):
    """Hooks that trace and measure invocations (see :mod:`trio_agents.otel`).

    ``tracer_provider`` / ``meter_provider``: the providers to use (default: the global ones,
    which are no-ops until an SDK is configured, e.g. by :func:`configure`).
    ``finish_reason_key``: the attribute that carries an invocation's ending (``completed``,
    ``cancelled``, ``failed``, ``paused``).

    One object serves any number of runners and invocations; it keeps only the spans still
    open.  Its methods never raise into the runner (the hooks' rules: a hook that fails is a
    warning) and never block.
    """

    name = "otel"
    nonblocking = True
    """Its methods never wait: the runner calls them without a deadline scope (see
    :mod:`trio_agents.hooks`); the SDK's exporters work in their own threads."""
    event_kinds = frozenset({"approval_decided", "tool_call_started"})
    """The events :meth:`on_record` needs (see :mod:`trio_agents.hooks`, "Fewer events")."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        finish_reason_key: str = FINISH_REASON,
    ) -> None:
        from . import __version__ as version

        self._tracer = trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, version, meter_provider=meter_provider)
        self._finish_key = finish_reason_key
        self._runs: dict[str, _Run] = {}
        # invoke_agent spans started by run_trace, by their traceparent, until their run starts
        self._opening: dict[str, Span] = {}
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self._op_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=_SECOND_BUCKETS,
        )
        self._agent_duration = meter.create_histogram(
            "gen_ai.invoke_agent.duration",
            unit="s",
            description="Duration of an agent invocation (one run)",
            explicit_bucket_boundaries_advisory=_SECOND_BUCKETS,
        )
        self._tool_duration = meter.create_histogram(
            "gen_ai.execute_tool.duration",
            unit="s",
            description="Duration of a tool call",
            explicit_bucket_boundaries_advisory=_SECOND_BUCKETS,
        )
        self._cancel_duration = meter.create_histogram(
            "trio_agents.cancel.duration",
            unit="s",
            description="From a cancel request to the stopped invocation",
            explicit_bucket_boundaries_advisory=_SECOND_BUCKETS,
        )
        self._journal_duration = meter.create_histogram(
            "trio_agents.journal.write.duration",
            unit="s",
            description="From an event's stamp to its durable write (tool intents and results)",
            explicit_bucket_boundaries_advisory=_SECOND_BUCKETS,
        )
        # Read when the metrics are collected: nothing is counted per invocation.
        meter.create_observable_up_down_counter(
            "trio_agents.invocations.running",
            [self._count_running],
            unit="{invocation}",
            description="Invocations running in this process (traced by these hooks)",
        )
        meter.create_observable_up_down_counter(
            "trio_agents.invocations.parked",
            [self._count_parked],
            unit="{invocation}",
            description="Invocations of this process waiting for a person's approval",
        )
        meter.create_observable_counter(
            "trio_agents.lease.renewals.late",
            [self._count_late_rounds],
            unit="{round}",
            description="Lease renewal rounds of this process answered more than a third of "
            "their period late, or missed (trio_agents.lease.round: late / missed)",
        )
        self._lease_stops = meter.create_counter(
            "trio_agents.lease.stops",
            unit="{invocation}",
            description="Invocations that stopped themselves for their lease (lost, or not "
            "renewed in time)",
        )

    # ---- trace context ------------------------------------------------------------------------

    def trace_context(self) -> Mapping[str, str]:
        """The caller's current span as W3C headers (asked by the runner in the caller's task),
        else the server's incoming request's."""
        current = trace.get_current_span()
        if current.get_span_context().is_valid:
            return _carrier(current)
        return incoming_trace.get()

    def run_trace(self, caller: Mapping[str, str]) -> Mapping[str, str]:
        """Start the run's ``invoke_agent`` span now, as the child of ``caller``, and answer
        its own context: the runner stores it in the ``started`` event before the run begins,
        so a resume links to this span even when the first run had no caller.  (A tracer that
        records nothing - no SDK configured - answers ``caller``.)"""
        span = self._tracer.start_span(
            "invoke_agent",
            context=_parent(caller) or otel_context.Context(),
            kind=SpanKind.INTERNAL,
        )
        if not span.is_recording():
            return caller
        carrier = _carrier(span)
        opening = self._opening
        opening[carrier["traceparent"]] = span
        if len(opening) > _OPENING_KEPT:  # runs that failed to open: end the oldest
            stale = opening.pop(next(iter(opening)))
            stale.set_attribute("trio_agents.invocation.opened", False)
            stale.end()
        return carrier

    # ---- hooks ------------------------------------------------------------------------------

    async def on_invocation_start(self, inv: InvocationInfo) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": inv.agent,
            "trio_agents.invocation.id": inv.invocation_id,
            "trio_agents.invocation.resumed": inv.resumed,
        }
        if inv.session_id is not None:
            attributes["gen_ai.conversation.id"] = inv.session_id
        links: list[Link] = []
        if inv.resumed:
            first = _parent(inv.first_trace)
            if first is not None:
                first_span = trace.get_current_span(first).get_span_context()
                links.append(Link(first_span, {"trio_agents.link": "first_run"}))
        span = self._opening.pop(inv.trace.get("traceparent", ""), None)  # run_trace's
        if span is not None:
            span.update_name(f"invoke_agent {inv.agent}")
            span.set_attributes(attributes)
            for link in links:
                span.add_link(link.context, link.attributes)
        else:
            span = self._tracer.start_span(
                f"invoke_agent {inv.agent}",
                context=_parent(inv.caller_trace) or otel_context.Context(),
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                links=links,
            )
        context = trace.set_span_in_context(span)
        run = _Run(info=inv, span=span, context=context, started=time.perf_counter())
        self._runs[inv.invocation_id] = run
        # Current in the invocation's task (and so in the tasks it spawns: trio copies the
        # context); detached in on_invocation_end, which this same task awaits.
        run.attached = _Attached(
            task=trio.lowlevel.current_task(), token=otel_context.attach(context)
        )

    async def on_model_start(self, inv: InvocationInfo, call: ModelCall) -> None:
        run = self._runs.get(inv.invocation_id)
        if run is None:
            return
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": call.provider,
            "gen_ai.request.model": call.model,
            "trio_agents.turn": call.turn,
        }
        if call.request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = call.request.max_tokens
        if call.request.temperature is not None:
            attributes["gen_ai.request.temperature"] = call.request.temperature
        span = self._tracer.start_span(
            f"chat {call.model}",
            context=self._parent_context(run, call.path),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        attached = self._attach(span, headers=True)
        run.chats[(call.path, call.turn)] = (span, time.perf_counter(), attached)

    async def on_model_end(self, inv: InvocationInfo, end: ModelCallEnd) -> None:
        run = self._runs.get(inv.invocation_id)
        call = end.call
        found = run.chats.pop((call.path, call.turn), None) if run is not None else None
        if run is None or found is None:
            return
        span, began, attached = found
        self._detach(attached)
        metric: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": call.provider,
            "gen_ai.request.model": call.model,
        }
        response = end.response
        if response is not None:
            usage = response.usage
            ended: dict[str, Any] = {
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
            }
            if response.model:
                ended["gen_ai.response.model"] = metric["gen_ai.response.model"] = response.model
            if response.request_id:
                ended["trio_agents.provider.request_id"] = response.request_id
            if response.finish_reason:
                ended["gen_ai.response.finish_reasons"] = (response.finish_reason,)
            span.set_attributes(ended)  # one call: the span's lock taken once
            self._tokens.record(usage.input_tokens, {**metric, "gen_ai.token.type": "input"})
            self._tokens.record(usage.output_tokens, {**metric, "gen_ai.token.type": "output"})
            if call.path:  # a tool call's span's parent: its step's ("" is the default)
                for tool_call in response.message.tool_calls:
                    run.call_paths[tool_call.id] = call.path
        elif end.error is not None:
            error_type = type(end.error).__name__
            span.set_status(Status(StatusCode.ERROR, str(end.error)[:200]))
            span.set_attribute("error.type", error_type)
            span.record_exception(end.error)
            metric["error.type"] = error_type
        else:  # cut off by a cancel: not an error
            span.set_attributes(
                {"gen_ai.response.finish_reasons": ("cancelled",), "trio_agents.cut_off": True}
            )
        self._op_duration.record(time.perf_counter() - began, metric)
        span.end()

    async def on_step_start(self, inv: InvocationInfo, step: StepCall) -> None:
        run = self._runs.get(inv.invocation_id)
        if run is None:
            return
        span = self._step(run, step.path)
        span.set_attribute("trio_agents.step.agent", step.agent)
        run.step_attached[step.path] = self._attach(span)

    async def on_step_end(self, inv: InvocationInfo, end: StepCallEnd) -> None:
        run = self._runs.get(inv.invocation_id)
        path = end.step.path
        span = run.steps.pop(path, None) if run is not None else None
        if run is None or span is None:
            return
        self._detach(run.step_attached.pop(path, None))
        if end.error is not None:
            span.set_status(Status(StatusCode.ERROR, str(end.error)[:200]))
            span.set_attribute("error.type", type(end.error).__name__)
        elif end.cut_off:
            span.set_attribute("trio_agents.cut_off", True)
        span.end()

    def _tool_started(self, run: _Run, call: ToolCall) -> None:
        """A tool call's intent is journaled (``tool_call_started``, in :meth:`on_record`, in
        the task that then runs the tool: what ``on_tool_start`` would be, one hook call less
        per tool call)."""
        if call.id in run.tools:  # started again after a credential wait: one span goes on
            return
        span = self._tool_span(run, call.id, call.name)
        # Current while the tool runs, and its W3C headers go out with the tool's own calls
        # (an A2A RemoteAgent's requests; an MCP client puts the current span in its _meta).
        attached = self._attach(span, headers=True)
        run.tools[call.id] = (span, time.perf_counter(), attached)

    async def on_tool_end(self, inv: InvocationInfo, result: ToolResult) -> None:
        run = self._runs.get(inv.invocation_id)
        if run is None:
            return
        found = run.tools.pop(result.call_id, None)
        if found is None:  # not started in this run: declined, not run, unknown outcome after
            # a crash, or the result of a long-running call started in an earlier run
            span = self._tool_span(run, result.call_id, result.name)
            span.set_attribute("trio_agents.tool.started_in_run", False)
            found = (span, time.perf_counter(), None)
        span, began, attached = found
        self._detach(attached)
        metric: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": result.name,
        }
        if result.is_error:
            span.set_status(Status(StatusCode.ERROR, result.content[:200]))
            span.set_attribute("error.type", "tool_error")
            metric["error.type"] = "tool_error"
        self._tool_duration.record(time.perf_counter() - began, metric)
        span.end()

    async def on_gate(self, inv: InvocationInfo, request: ApprovalRequested) -> None:
        run = self._runs.get(inv.invocation_id)
        if run is None:
            return
        span = self._tracer.start_span(
            f"await_approval {request.call.name}",
            context=self._parent_context(run, request.path),
            attributes={
                "trio_agents.approval.id": request.approval_id,
                "gen_ai.tool.name": request.call.name,
                "gen_ai.tool.call.id": request.call.id,
            },
            start_time=_ns(request.at),
        )
        run.gates[request.approval_id] = span

    async def on_record(self, inv: InvocationInfo, event: Event) -> None:
        """Inline, in the recording task, right after the durable write (``event_kinds``)."""
        run = self._runs.get(inv.invocation_id)
        if run is None:
            return
        if isinstance(event, ApprovalDecided):
            span = run.gates.pop(event.approval_id, None)
            if span is not None:
                self._end_gate(run, span, event.state, event.by, event.reason, _ns(event.at))
        elif isinstance(event, ToolCallStarted):
            # From its stamp to now: the journal's write (the tool waits for it).
            self._journal_duration.record(max(0.0, time.time() - event.at), _JOURNAL)
            self._tool_started(run, event.call)

    async def on_invocation_end(self, inv: InvocationInfo, outcome: Outcome) -> None:
        run = self._runs.pop(inv.invocation_id, None)
        if run is None:
            return
        status = outcome.status
        cancelled = status == "cancelled"
        ending: dict[str, Any] = {}
        if cancelled:
            ending[CANCEL_MODE] = outcome.cancel_mode or "immediate"
            if outcome.reason:
                ending[CANCEL_REASON] = outcome.reason
            if outcome.cancelled_by:
                ending[CANCEL_BY] = outcome.cancelled_by
        # What is still open ends now: a tool cut off, a gate the cancel (or a pause) closed.
        for call_id, (span, began, attached) in list(run.tools.items()):
            self._detach(attached)
            span.set_attributes({**ending, self._finish_key: status, "trio_agents.cut_off": True})
            self._tool_duration.record(
                time.perf_counter() - began,
                {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": _tool_of(span)},
            )
            span.end()
            del run.tools[call_id]
        for gate_id, span in list(run.gates.items()):
            state = outcome.gates.get(gate_id, "cancelled" if cancelled else "pending")
            self._end_gate(run, span, state, outcome.cancelled_by, outcome.reason, None)
        run.gates.clear()
        for _, (span, _began, attached) in list(run.chats.items()):  # on_model_end missed
            self._detach(attached)
            span.end()
        run.chats.clear()
        for path, step in reversed(list(run.steps.items())):
            self._detach(run.step_attached.pop(path, None))
            step.set_attributes(ending)
            step.end()
        run.steps.clear()
        span = run.span
        span.set_attributes(
            {
                self._finish_key: status,
                "trio_agents.invocation.status": status,
                "gen_ai.usage.input_tokens": outcome.usage.input_tokens,
                "gen_ai.usage.output_tokens": outcome.usage.output_tokens,
            }
        )
        metric: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": inv.agent,
            "trio_agents.invocation.status": status,
        }
        if cancelled:
            span.set_attributes(ending)
            if outcome.reason is not None and outcome.reason.startswith("lease "):
                self._lease_stops.add(1, {"gen_ai.agent.name": inv.agent})
            if outcome.cancel_requested_at is not None:  # the terminal event is stored now
                self._cancel_duration.record(
                    max(0.0, time.time() - outcome.cancel_requested_at),
                    {"gen_ai.agent.name": inv.agent, CANCEL_MODE: ending[CANCEL_MODE]},
                )
        elif status == "failed":
            error_type = outcome.error.type if outcome.error is not None else "failed"
            span.set_status(Status(StatusCode.ERROR, (outcome.reason or "")[:200]))
            span.set_attribute("error.type", error_type)
            if outcome.exception is not None:
                span.record_exception(outcome.exception)
            metric["error.type"] = error_type
        elif status == "paused" and outcome.pending_approvals:
            span.set_attribute("trio_agents.pending_approvals", outcome.pending_approvals)
        self._agent_duration.record(time.perf_counter() - run.started, metric)
        self._detach(run.attached)
        span.end()

    # ---- helpers -----------------------------------------------------------------------------

    def _count_running(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        counts: dict[str, int] = {}
        for run in list(self._runs.values()):
            counts[run.info.agent] = counts.get(run.info.agent, 0) + 1
        return [metrics.Observation(n, {"gen_ai.agent.name": a}) for a, n in counts.items()]

    def _count_parked(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        counts: dict[str, int] = {}
        for run in list(self._runs.values()):
            if run.gates:
                counts[run.info.agent] = counts.get(run.info.agent, 0) + 1
        return [metrics.Observation(n, {"gen_ai.agent.name": a}) for a, n in counts.items()]

    @staticmethod
    def _count_late_rounds(
        options: metrics.CallbackOptions,
    ) -> Iterable[metrics.Observation]:
        rounds = lease_rounds()
        return [
            metrics.Observation(rounds.late, {"trio_agents.lease.round": "late"}),
            metrics.Observation(rounds.missed, {"trio_agents.lease.round": "missed"}),
        ]

    def _parent_context(self, run: _Run, path: str) -> otel_context.Context:
        """The context of the span that is the parent of what runs in step ``path``."""
        return trace.set_span_in_context(self._step(run, path)) if path else run.context

    def _step(self, run: _Run, path: str) -> Span:
        """The span of the workflow step ``path`` (made at its first sight), or the run's."""
        if not path:
            return run.span
        found = run.steps.get(path)
        if found is None:
            parent_path, _, name = path.rpartition("/")
            parent = self._step(run, parent_path)
            found = self._tracer.start_span(
                f"step {name}",
                context=trace.set_span_in_context(parent),
                attributes={"trio_agents.step": path, "gen_ai.agent.name": run.info.agent},
            )
            run.steps[path] = found
        return found

    def _tool_span(self, run: _Run, call_id: str, name: str) -> Span:
        path = run.call_paths.get(call_id, "")
        return self._tracer.start_span(
            f"execute_tool {name}",
            context=self._parent_context(run, path),
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
            },
        )

    def _end_gate(
        self,
        run: _Run,
        span: Span,
        state: str,
        by: str | None,
        reason: str | None,
        end_time: int | None,
    ) -> None:
        span.set_attribute("trio_agents.approval.state", state)
        if by:
            span.set_attribute("trio_agents.approval.by", by)
        if reason:
            span.set_attribute("trio_agents.approval.reason", reason)
        span.end(end_time=end_time)

    @staticmethod
    def _attach(span: Span, *, headers: bool = False) -> _Attached:
        ctx = trace.set_span_in_context(span)
        attached = _Attached(task=trio.lowlevel.current_task(), token=otel_context.attach(ctx))
        if headers and span.get_span_context().is_valid:
            attached.headers = outgoing_trace.set(_carrier(span))
        return attached

    @staticmethod
    def _detach(attached: _Attached | None) -> None:
        """Detach in the task that attached (elsewhere the task's own context is not ours to
        change: it ends with its task)."""
        if attached is None or attached.task is not trio.lowlevel.current_task():
            return
        if attached.headers is not None:
            outgoing_trace.reset(attached.headers)
        otel_context.detach(attached.token)  # type: ignore[arg-type]


def _tool_of(span: Span) -> str:
    attributes = getattr(span, "attributes", None) or {}
    return str(attributes.get("gen_ai.tool.name", ""))
