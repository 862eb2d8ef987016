"""Tools: plain Python functions a model may call.

:func:`tool` turns an ``async def`` or plain ``def`` function into a :class:`Tool`.  The JSON
schema the model sees is built by pydantic from the signature; the description and the
per-parameter descriptions come from the docstring (Google, NumPy or reST style, read by
docstring_parser).  Every misconfiguration is a :class:`~trio_agents.UsageError` at decoration
time, not a surprise in the middle of an agent run.

:meth:`Tool.call` runs one :class:`~trio_agents.messages.ToolCall` and always answers with a
:class:`~trio_agents.messages.ToolResult` -- bad arguments, an exception raised by the tool and the
tool's own timeout all come back as ``is_error=True`` results the model can read and act on --
with one exception: a cancel of the enclosing invocation propagates as ``trio.Cancelled``.  A
cancelled tool produces no result at all.

Sync tools run in a worker thread (``trio.to_thread.run_sync(..., abandon_on_cancel=False)``).
A thread cannot be interrupted, so a cancel -- or the tool's timeout -- takes effect only when the
function returns; long-running sync tools should call ``trio.from_thread.check_cancelled()`` now
and then, which raises ``trio.Cancelled`` in the thread once the call has been cancelled.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import (
    Any,
    Generic,
    ParamSpec,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
    runtime_checkable,
)

import attrs
import docstring_parser
import pydantic
import pydantic_core
import trio
from pydantic.fields import FieldInfo

from ._exceptions import NeedsCredential, ToolError, UsageError
from .messages import ToolCall, ToolResult, ToolSpec

__all__ = ["InputAnswer", "Tool", "ToolContext", "ToolOptions", "Toolset", "tool"]

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)

# What both OpenAI and Anthropic accept as a function name.
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# JSON-schema keywords whose values are data, not schemas: never strip a "title" inside them.
_DATA_KEYWORDS = frozenset({"default", "const", "enum", "examples"})
# Keywords whose values map *names* to schemas: a property may well be called "title".
_NAMED_SCHEMAS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


@attrs.frozen(kw_only=True)
class ToolContext:
    """What a tool may know about the call it serves.

    A parameter annotated ``ToolContext`` (or ``ToolContext | None``) receives it; such a
    parameter is not part of the JSON schema, so the model never sees it.

    Attributes:
        invocation_id: the invocation the call belongs to.
        call_id: the model's id for this tool call.
        tool_name: the name the tool was called by.
        idempotency_key: stable across re-runs of the same call (by default
            ``f"{invocation_id}:{call_id}"``): pass it to external systems that deduplicate.
        attempt: 1 normally; greater than 1 when the call is run again on resume after a crash
            left its outcome unknown.
        user_id: the user the invocation runs for, when one was given.

    Credentials a person submitted after the tool raised
    :class:`~trio_agents.NeedsCredential` are read with :meth:`credential`; they are held in
    this process's memory only and never shown in the context's ``repr``.
    """

    invocation_id: str
    call_id: str
    tool_name: str
    attempt: int = 1
    user_id: str | None = None
    idempotency_key: str = attrs.field()
    credentials: Mapping[str, str] = attrs.field(factory=dict, repr=False, eq=False, hash=False)
    progress: Callable[[float, float | None, str | None], None] | None = attrs.field(
        default=None, repr=False, eq=False, hash=False
    )
    ask_input: Callable[[str, Mapping[str, Any]], Awaitable[InputAnswer]] | None = attrs.field(
        default=None, repr=False, eq=False, hash=False
    )

    def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Publish this call's progress as a ``tool_progress`` event (not journaled)."""
        if self.progress is not None:
            self.progress(progress, total, message)

    @idempotency_key.default
    def _default_idempotency_key(self) -> str:
        return f"{self.invocation_id}:{self.call_id}"

    async def request_input(self, message: str, schema: Mapping[str, Any]) -> InputAnswer:
        """Ask a person for input while this call runs (an ``input_requested`` gate, journaled;
        answered with ``runner.decide``) and wait for the answer.  Outside an invocation (no
        one to ask) the answer is a ``decline``.

        Raises :class:`~trio_agents.agents.StopRequested` / ``trio.Cancelled`` when a cancel
        ends the wait (the gate ends ``cancelled``).
        """
        if self.ask_input is None:
            return InputAnswer(action="decline", state="submitted")
        return await self.ask_input(message, schema)

    def credential(self, name: str) -> str | None:
        """The credential ``name`` submitted for this invocation, or ``None`` (then raise
        ``NeedsCredential(name)`` to ask for it)."""
        return self.credentials.get(name)


@attrs.frozen
class InputAnswer:
    """A person's answer to :meth:`ToolContext.request_input`: ``action`` is ``accept`` (with
    ``content``, valid against the schema), ``decline`` or ``cancel``; ``state`` how the gate
    ended (``submitted``, or ``expired``: then the action is ``cancel``)."""

    action: str
    content: dict[str, Any] | None = None
    state: str = "submitted"


@runtime_checkable
class Toolset(Protocol):
    """Tools that exist only while their owner serves them (an MCP server's: see
    :mod:`trio_agents.mcp`).  An agent given a toolset (``Agent(tools=[server])``) asks it for
    :meth:`current_tools` at each model turn.

    The runner owns a toolset like a model: it starts :meth:`serve` in a nursery of its own (not
    in any invocation's scope) before the first invocation that needs it, shares it among all
    invocations, and cancels it when the runner closes, after the last invocation ended.
    """

    name: str

    def current_tools(self) -> Mapping[str, Tool[..., Any]]:
        """The tools by the name the model sees; raises :class:`UsageError` when not served."""
        ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open, report readiness through ``task_status`` once :attr:`tools` can be read, and
        hold the toolset open until cancelled (:meth:`current_tools` can be read meanwhile)."""
        ...


@attrs.frozen
class _Param:
    name: str
    kind: inspect._ParameterKind
    field: str | None  # the argument model's field; None for the injected ToolContext


class ToolOptions(TypedDict, total=False):
    """The options of :func:`tool`, also the keywords of :meth:`Tool.with_options`."""

    name: str | None
    description: str | None
    timeout: float | None
    requires_approval: bool
    idempotent: bool
    approval_prompt: str | None
    approval_expires_after: float | None
    long_running: bool


class Tool(Generic[P, R]):
    """A function a model may call, with its name, description and JSON schema.

    Build one with :func:`tool` (or this constructor, which takes the same options).  The
    original function stays reachable as :attr:`fn`, so it can be unit-tested directly.

    Attributes:
        fn: the decorated function, unchanged.
        name: the name the model calls the tool by.
        description: what the model is told the tool does.
        timeout: seconds one call may take, or ``None`` for no limit.
        requires_approval: a human must approve each call before it runs.
        idempotent: running a call twice is harmless, so a call whose outcome was lost in a
            crash may simply be run again on resume.
        approval_prompt: what a person deciding on a call is shown (on ``approval_requested``),
            besides the description.
        approval_expires_after: seconds after the request a gate of this tool (approval,
            long-running result, credential) ends ``expired`` (default: the runner's
            ``approval_expires_after``).
        long_running: the function starts the work and returns a handle at once; the call's
            result is submitted later (:meth:`Runner.submit_result`).

    Raises:
        UsageError: the function cannot be a tool (see :func:`tool`).
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        requires_approval: bool = False,
        idempotent: bool = False,
        approval_prompt: str | None = None,
        approval_expires_after: float | None = None,
        long_running: bool = False,
    ) -> None:
        if isinstance(fn, Tool):
            raise UsageError(f"{fn!r} is already a tool; use .with_options(...) to change it")
        if isinstance(fn, str):
            raise UsageError(f"@tool got the string {fn!r}; did you mean @tool(name={fn!r})?")
        if not callable(fn):
            raise UsageError(f"@tool needs a function, got {fn!r}")
        # For a partial, the name and docstring are those of the function it wraps.
        target: Any = fn.func if isinstance(fn, functools.partial) else fn
        if name is None:
            name = getattr(target, "__name__", None)
            if not isinstance(name, str):
                raise UsageError(f"cannot infer a tool name from {fn!r}; pass name=...")
        if not _NAME_RE.fullmatch(name):
            raise UsageError(
                f"invalid tool name {name!r}: model APIs require 1 to 64 letters, digits, "
                "'_' or '-'; pass name=..."
            )
        if timeout is not None and not timeout > 0:  # `not >` also rejects NaN
            raise UsageError(
                f"tool {name!r}: timeout must be a positive number of seconds, got {timeout!r}"
            )
        if approval_expires_after is not None and not approval_expires_after > 0:
            raise UsageError(
                f"tool {name!r}: approval_expires_after must be positive seconds or None, "
                f"got {approval_expires_after!r}"
            )
        if approval_prompt is not None and not isinstance(approval_prompt, str):
            raise UsageError(
                f"tool {name!r}: approval_prompt must be a str, got {approval_prompt!r}"
            )
        if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
            raise UsageError(f"tool {name!r}: a generator cannot be a tool; return a value")

        doc = docstring_parser.parse(inspect.getdoc(target) or "")
        if description is None:
            parts = (doc.short_description, doc.long_description)
            description = "\n\n".join(part for part in parts if part)
        param_docs = {p.arg_name: p.description for p in doc.params if p.description}

        self.fn: Callable[P, R] = fn
        self.name: str = name
        self.description: str = description
        self.timeout: float | None = timeout
        self.requires_approval: bool = requires_approval
        self.idempotent: bool = idempotent
        self.approval_prompt: str | None = approval_prompt
        self.approval_expires_after: float | None = approval_expires_after
        self.long_running: bool = long_running
        self._call_fn: Callable[..., Any] = fn
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004  (an object with an async __call__)
        )
        self._params, self._arguments, schema = _arguments_model(fn, name, param_docs)
        self._spec = ToolSpec(name=name, description=description, parameters=schema)

    @property
    def spec(self) -> ToolSpec:
        """What the model is told: name, description and the JSON schema of the arguments."""
        return self._spec

    def with_options(self, **changes: Unpack[ToolOptions]) -> Tool[P, R]:
        """Return a copy of this tool with some options changed; this one is left as it is.

        Raises:
            UsageError: an option is invalid (a bad name, a non-positive timeout).
        """
        options = ToolOptions(
            name=self.name,
            description=self.description,
            timeout=self.timeout,
            requires_approval=self.requires_approval,
            idempotent=self.idempotent,
            approval_prompt=self.approval_prompt,
            approval_expires_after=self.approval_expires_after,
            long_running=self.long_running,
        )
        options.update(changes)
        return Tool(self.fn, **options)

    def validate_arguments(self, arguments: str | Mapping[str, Any]) -> str:
        """Check ``arguments`` (JSON text or a mapping) exactly as a model's are checked;
        return them as JSON text.

        Raises:
            UsageError: not JSON, not an object, or failing validation - the message names
                each bad field, as the model would be told.
        """
        if isinstance(arguments, Mapping):
            try:
                text = pydantic_core.to_json(dict(arguments)).decode()
            except pydantic_core.PydanticSerializationError as exc:
                raise UsageError(f"arguments for tool {self.name!r} are not JSON: {exc}") from exc
        elif isinstance(arguments, str):
            text = arguments.strip() or "{}"
        else:
            raise UsageError(
                f"arguments for tool {self.name!r} must be a JSON object (a dict or its text), "
                f"got {type(arguments).__name__}"
            )
        try:
            self._arguments.model_validate_json(text)
        except pydantic.ValidationError as exc:
            raise UsageError(f"Invalid arguments for tool {self.name!r}: {_explain(exc)}") from None
        return text

    async def call(self, call: ToolCall, context: ToolContext) -> ToolResult:
        """Validate ``call.arguments``, run the tool, and return what the model should read.

        ``call.arguments`` is JSON text as the model wrote it (empty means ``{}``).  Every outcome
        short of a cancel is a :class:`ToolResult`: invalid JSON or arguments that fail validation
        (``is_error=True``, naming each bad field, so the model can fix its call); an
        ``Exception`` raised by the tool (``is_error=True``: a :class:`ToolError`'s message as is,
        any other as ``"TypeName: message"``); the tool's own :attr:`timeout` expiring
        (``is_error=True``, ``"tool 'x' timed out after 5s"``); otherwise the return value as
        text (a ``str`` as is, anything else as JSON, ``str()`` for what JSON cannot hold).

        Cancellation: a cancel from outside -- the invocation being cancelled -- propagates as
        ``trio.Cancelled`` and never becomes a result, even if the tool returned or raised after
        the cancel arrived.  A sync tool runs in a worker thread that cannot be interrupted: the
        cancel waits until the function returns (or calls ``trio.from_thread.check_cancelled()``).

        Raises:
            trio.Cancelled: the enclosing scope was cancelled.
            BaseException: a ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
                ``SystemExit``) raised by the tool passes through.
        """
        try:
            validated = self._arguments.model_validate_json(call.arguments.strip() or "{}")
        except pydantic.ValidationError as exc:
            return self._error(call, f"Invalid arguments for tool {self.name!r}: {_explain(exc)}")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for param in self._params:
            value = context if param.field is None else getattr(validated, param.field)
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                args.append(value)
            else:
                kwargs[param.name] = value

        if self.timeout is None:
            return await self._run(call, args, kwargs)
        with trio.move_on_after(self.timeout) as scope:
            result = await self._run(call, args, kwargs)
        # Trio lets a scope catch only its *own* cancel: when the invocation is cancelled too,
        # Cancelled passes through move_on_after and out of this method.
        if scope.cancelled_caught:
            return self._error(call, f"tool {self.name!r} timed out after {self.timeout:g}s")
        return result

    async def _run(self, call: ToolCall, args: list[Any], kwargs: dict[str, Any]) -> ToolResult:
        try:
            if self._is_async:
                value = await self._call_fn(*args, **kwargs)
            else:
                value = await trio.to_thread.run_sync(
                    functools.partial(self._call_fn, *args, **kwargs), abandon_on_cancel=False
                )
            content = _to_text(value)
        except Exception as exc:  # trio.Cancelled is a BaseException: it passes straight through
            if isinstance(_leaf(exc), NeedsCredential):  # a signal for the agent loop
                await trio.lowlevel.checkpoint_if_cancelled()
                raise _leaf(exc) from None
            if not isinstance(_leaf(exc), ToolError):
                logger.warning("tool %r raised", self.name, exc_info=exc)
            result = self._error(call, _describe(exc))
        else:
            result = ToolResult(call_id=call.id, name=self.name, content=content)
        # A thread cannot be interrupted and a misbehaving tool may swallow Cancelled: either
        # way, a cancel that arrived while the tool ran wins over whatever it produced.
        await trio.lowlevel.checkpoint_if_cancelled()
        return result

    def _error(self, call: ToolCall, content: str) -> ToolResult:
        return ToolResult(call_id=call.id, name=self.name, content=content, is_error=True)

    def __repr__(self) -> str:
        return f"<Tool {self.name!r} fn={self.fn!r}>"


@overload
def tool(
    fn: Callable[P, R],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    requires_approval: bool = False,
    idempotent: bool = False,
    approval_prompt: str | None = None,
    approval_expires_after: float | None = None,
    long_running: bool = False,
) -> Tool[P, R]: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    requires_approval: bool = False,
    idempotent: bool = False,
    approval_prompt: str | None = None,
    approval_expires_after: float | None = None,
    long_running: bool = False,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None, /, **options: Unpack[ToolOptions]
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a :class:`Tool` of a function; use it bare (``@tool``) or with options (``@tool(...)``).

    Every parameter needs a type annotation pydantic can describe as JSON schema; a parameter
    annotated :class:`ToolContext` is filled in by the runner instead.  The docstring's summary is
    the description unless ``description=`` is given, and its ``Args`` / ``Parameters`` /
    ``:param:`` entries describe the parameters.

    Args:
        fn: an ``async def`` function (awaited in the invocation's task) or a plain ``def`` one
            (run in a worker thread).
        name: the name the model sees (default: the function's name); 1 to 64 letters, digits,
            ``_`` or ``-``.
        description: what the model is told the tool does (default: from the docstring).
        timeout: seconds one call may take; when they run out the model gets an error result.
        requires_approval: a human must approve each call before it runs.
        idempotent: the tool may be run again when a crash left a call's outcome unknown.
        approval_prompt: shown to the person deciding (on ``approval_requested``).
        approval_expires_after: seconds after which a gate of this tool ends ``expired``.
        long_running: the function returns a handle at once; the result comes later through
            :meth:`Runner.submit_result` (the invocation waits for it like for an approval).

    Raises:
        UsageError: not a callable, or a generator; an invalid name or a non-positive timeout;
            a parameter without a type annotation, ``*args`` / ``**kwargs``, or a type that cannot
            be expressed as JSON schema.
    """
    if fn is None:
        return lambda f: Tool(f, **options)
    return Tool(fn, **options)


def _arguments_model(
    fn: Callable[..., Any], name: str, param_docs: dict[str, str]
) -> tuple[tuple[_Param, ...], type[pydantic.BaseModel], dict[str, Any]]:
    try:
        signature = inspect.signature(fn, eval_str=True)
    except NameError as exc:
        raise UsageError(f"tool {name!r}: cannot resolve a type annotation: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise UsageError(f"tool {name!r}: cannot read the signature of {fn!r}: {exc}") from exc
    params: list[_Param] = []
    fields: dict[str, Any] = {}
    for index, p in enumerate(signature.parameters.values()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind is p.VAR_POSITIONAL else "**"
            raise UsageError(
                f"tool {name!r}: parameter '{star}{p.name}' is not allowed; "
                "a tool takes named parameters only"
            )
        if p.annotation is p.empty:
            raise UsageError(f"tool {name!r}: parameter {p.name!r} has no type annotation")
        if _is_context(p.annotation):
            params.append(_Param(p.name, p.kind, None))
            continue
        # Fields get neutral names and the parameter's name as alias, so parameters called
        # `_x`, `json` or `model_config` cannot collide with pydantic's own attributes.
        field = f"p{index}"
        params.append(_Param(p.name, p.kind, field))
        # A description given with `Annotated[..., Field(description=...)]` beats the docstring.
        own_description = FieldInfo.from_annotation(p.annotation).description
        info = pydantic.Field(
            default=... if p.default is p.empty else p.default,
            alias=p.name,
            description=own_description or param_docs.get(p.name),
        )
        fields[field] = (p.annotation, info)
    try:
        model = pydantic.create_model(
            f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        schema = _strip_titles(model.model_json_schema())
    except pydantic.PydanticUserError as exc:
        culprits = [p.name for p in params if p.field and not _has_schema(fields[p.field][0])]
        what = f"parameter {culprits[0]!r}" if culprits else "a parameter"
        reason = str(exc).splitlines()[0]
        raise UsageError(f"tool {name!r}: {what} has a type with no JSON schema: {reason}") from exc
    schema.pop("type", None)
    # The order a reader expects; `$defs` and `additionalProperties` follow.
    schema = {
        "type": "object",
        "properties": schema.pop("properties", {}),
        "required": schema.pop("required", []),
        **schema,
    }
    return tuple(params), model, schema


def _has_schema(annotation: Any) -> bool:
    try:
        pydantic.TypeAdapter(annotation).json_schema()
    except pydantic.PydanticUserError:
        return False
    return True


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's generated ``title`` keywords (noise to a model) from a JSON schema."""
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def _is_context(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = set(typing.get_args(annotation))
        return ToolContext in members and members <= {ToolContext, type(None)}
    return False


def _explain(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        loc = loc.removeprefix(".")
        parts.append(f"{loc}: {error['msg']}" if loc else error["msg"])
    return "; ".join(parts)


def _to_text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return pydantic_core.to_json(value, fallback=str).decode()
    except (pydantic_core.PydanticSerializationError, ValueError):  # e.g. a circular reference
        return str(value)


def _leaf(exc: BaseException) -> BaseException:
    # A tool that opens a nursery reports a single failure wrapped in an ExceptionGroup.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    leaf = _leaf(exc)
    if isinstance(leaf, ToolError):
        return str(leaf)
    message = str(leaf)
    return f"{type(leaf).__name__}: {message}" if message else type(leaf).__name__
