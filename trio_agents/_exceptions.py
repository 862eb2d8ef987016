"""The one error tree of trio_agents.

Every error the library raises on purpose is a :class:`TrioAgentsError`.  Misuse, failures of the
world outside, and signals are kept apart::

    TrioAgentsError
    ├── UsageError (ValueError)            you called us wrong: fix the code, do not retry
    │   └── GateClosed                     a decision, result or credential came for a gate
    │                                      that ended already (expired, cancelled, ...)
    ├── ModelError                         the model server failed us (carries provider, status,
    │   │                                  request id and the provider's own message)
    │   ├── ModelConnectionError           no connection could be made (before any byte)
    │   ├── ModelTimeoutError              connect, read or whole-turn timeout
    │   ├── ModelStatusError               an HTTP error status
    │   │   ├── AuthenticationError        401 / 403
    │   │   ├── BadRequestError            400 / 422 (also "unsupported parameter")
    │   │   ├── NotFoundError              404 (unknown model, wrong base URL)
    │   │   ├── RateLimitError             429
    │   │   ├── OverloadedError            503 / 529 (an overload *inside* a 200 stream is a
    │   │   │                              StreamErrorEvent, code "overloaded_error")
    │   │   └── ServerError                other 5xx
    │   ├── StreamBrokenError              the connection broke after the stream began
    │   ├── MalformedStreamError           bytes that are not the protocol
    │   └── StreamErrorEvent               an error event inside a 200 stream (Groq, OpenRouter,
    │                                      Anthropic, OpenAI Responses)
    ├── ToolError                          raised *by a tool* to send a message back to the model
    ├── MCPServerError                     an MCP server could not be started, reached or
    │                                      listed (``ta.mcp``; names the server)
    ├── NeedsCredential                    raised *by a tool*: a signal, not a failure - the
    │                                      invocation asks for the credential, then runs it again
    ├── MaxTurnsExceeded                   the agent loop ran out of turns
    └── StoreError                         the store could not do what was asked
        ├── InvocationNotFound (KeyError)  no invocation with that id
        ├── SessionNotFound (KeyError)     no session with that id
        ├── BatchNotFound (KeyError)       no batch with that id
        ├── CorruptRecordError             a stored record that cannot be read (or a future
        │                                  version of one)
        ├── LeaseError                     another process owns the invocation (or owned it
        │                                  and fenced us out)
        ├── SessionBusy                    the session has another invocation running
        └── StoreUnavailableError          the database is down or unreachable

``trio.Cancelled`` is never in this tree and is never turned into one of these errors: a cancel
is not a failure.  Errors from httpx2 are translated into ``ModelError`` at one boundary
(``trio_agents.models._http``) with ``raise ... from exc``.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "BatchNotFound",
    "CorruptRecordError",
    "GateClosed",
    "InvocationNotFound",
    "LeaseError",
    "MCPServerError",
    "MalformedStreamError",
    "MaxTurnsExceeded",
    "ModelConnectionError",
    "ModelError",
    "ModelStatusError",
    "ModelTimeoutError",
    "NeedsCredential",
    "NotFoundError",
    "OverloadedError",
    "RateLimitError",
    "ServerError",
    "SessionBusy",
    "SessionNotFound",
    "StoreError",
    "StoreUnavailableError",
    "StreamBrokenError",
    "StreamErrorEvent",
    "ToolError",
    "TrioAgentsError",
    "UsageError",
]


class TrioAgentsError(Exception):
    """Base class of every error trio_agents raises on purpose."""


class UsageError(TrioAgentsError, ValueError):
    """The library was used wrongly: a misconfigured agent, a bad argument, a bad URL."""


class GateClosed(UsageError):
    """A decision, a result or a credential came for a gate that is closed for good: it
    ended ``expired`` or ``cancelled`` (``state``), so nothing was recorded.

    A gate that was merely decided already is not this error: :meth:`Runner.decide` returns
    ``False`` then (the first decision stands).
    """

    def __init__(self, message: str, *, gate_id: str, state: str) -> None:
        super().__init__(message)
        self.gate_id = gate_id
        self.state = state


class ModelError(TrioAgentsError):
    """A model server failed a request.

    Attributes:
        message: the provider's own message when it sent one, else ours.
        provider: ``"openai"``, ``"anthropic"``, ... (the wire format).
        status_code: the HTTP status, when there was one.
        request_id: the server's request id header, when it sent one.
        retryable: whether a new attempt could succeed (429, 5xx, connection refused).
        retry_after: seconds the server asked us to wait, when it said.
        body: the raw error body (a short prefix), for logs.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status_code: int | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        body: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.status_code = status_code
        self.request_id = request_id
        self.retry_after = retry_after
        self.body = body
        self.code = code

    def __str__(self) -> str:
        parts = []
        if self.provider:
            parts.append(self.provider)
        if self.status_code is not None:
            parts.append(str(self.status_code))
        prefix = f"[{' '.join(parts)}] " if parts else ""
        suffix = f" (request id {self.request_id})" if self.request_id else ""
        return f"{prefix}{self.message}{suffix}"


class ModelConnectionError(ModelError):
    """No connection to the model server could be made; nothing was sent or received."""

    retryable = True


class ModelTimeoutError(ModelError):
    """A connect, read or whole-turn timeout expired."""

    retryable = True


class ModelStatusError(ModelError):
    """The model server answered with an HTTP error status."""


class AuthenticationError(ModelStatusError):
    """401 / 403: the API key is missing, wrong, or lacks access."""


class BadRequestError(ModelStatusError):
    """400 / 422: the server rejected the request as malformed or unsupported."""


class NotFoundError(ModelStatusError):
    """404: unknown model or wrong base URL."""


class RateLimitError(ModelStatusError):
    """429: too many requests; ``retry_after`` says how long the server asked us to wait."""

    retryable = True


class OverloadedError(ModelStatusError):
    """503 / 529: the server is overloaded."""

    retryable = True


class ServerError(ModelStatusError):
    """Any other 5xx."""

    retryable = True


class StreamBrokenError(ModelError):
    """The connection broke after the stream had begun; the partial output is kept."""


class MalformedStreamError(ModelError):
    """The server sent bytes that are not the protocol (bad JSON, an unknown frame)."""


class StreamErrorEvent(ModelError):
    """The server sent an error *inside* a 200 stream (Groq, OpenRouter, Anthropic, OpenAI
    Responses do this).  ``code`` is the provider's error code or type; part of the turn may
    have been delivered, so nothing retries it, but ``retryable`` says whether a new attempt
    could succeed (Anthropic's ``overloaded_error``)."""


class ToolError(TrioAgentsError):
    """Raised by a tool to report a failure to the model with exactly this message."""


class MCPServerError(TrioAgentsError):
    """An MCP server (:mod:`trio_agents.mcp`) could not be started or reached, died, or listed
    tools that cannot be used; the message names the server.  Raised when the runner opens the
    server; during a call the model gets it as a tool error instead."""


class NeedsCredential(TrioAgentsError):
    """Raised by a tool that cannot run without a credential (an API key, an OAuth token).

    A signal, not a failure: the invocation journals a ``credential_requested`` event (with
    ``name``, ``hint`` and ``scopes``, never a secret), waits - hot, then cold ``paused`` past
    the runner's ``approval_timeout`` - until ``runner.submit_credential(...)``, then runs the
    tool again; the tool reads the credential with ``ctx.credential(name)``.
    """

    def __init__(
        self, name: str, *, hint: str | None = None, scopes: tuple[str, ...] | list[str] = ()
    ) -> None:
        if not isinstance(name, str) or not name:
            raise UsageError(f"NeedsCredential needs a non-empty credential name, got {name!r}")
        super().__init__(f"needs credential {name!r}")
        self.name = name
        self.hint = hint
        self.scopes = tuple(scopes)


class MaxTurnsExceeded(TrioAgentsError):
    """The agent used all of its ``max_turns`` without producing a final answer."""


class StoreError(TrioAgentsError):
    """The store could not do what was asked."""


class InvocationNotFound(StoreError, KeyError):
    """No invocation with that id is known to the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "invocation not found"


class BatchNotFound(StoreError, KeyError):
    """No batch with that id is known to the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "batch not found"


class SessionNotFound(StoreError, KeyError):
    """No session with that id is known to the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "session not found"


class CorruptRecordError(StoreError):
    """A stored record cannot be read: damaged, or written by a newer version."""


class LeaseError(StoreError):
    """Another process owns this invocation's lease, or took it over from us."""


class SessionBusy(StoreError):
    """The session already has an invocation running (at most one at a time, unless
    ``exclusive=False`` was asked); wait for it to end, or cancel it, and try again."""


class StoreUnavailableError(StoreError):
    """The database is down or unreachable."""
