"""One tool of an MCP server, as an ordinary agent tool.

Its JSON schema is the server's ``inputSchema``; arguments are checked against it (JSON Schema,
by ``jsonschema``) before anything is sent, so a bad call costs no round trip and the model is
told which field is wrong.  Its policy (approval, idempotence, timeout) comes from
:class:`ToolPolicy`.  The call itself goes through the server's shared session
(:meth:`MCPServer.call_tool`), which owns the cancel: see :mod:`trio_agents.mcp._server`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn, Unpack

import attrs
import jsonschema  # type: ignore[import-untyped]
import trio

from .._exceptions import MCPServerError, UsageError
from ..messages import ToolCall, ToolResult, ToolSpec
from ..tools import Tool, ToolContext, ToolOptions

if TYPE_CHECKING:
    from ._server import MCPServer

__all__ = ["MCPTool", "ToolPolicy"]


@attrs.frozen(kw_only=True)
class ToolPolicy:
    """How the agent treats one tool of an MCP server (``policy={"tool_name": ToolPolicy(...)}``,
    keyed by the server's own tool name).

    Attributes:
        requires_approval: a person approves each call before it is sent.
        idempotent: calling it twice is harmless, so a call whose outcome a crash of this
            process left unknown is sent again on resume (otherwise the model is told the
            outcome is unknown).
        timeout: seconds one call may take (a wait for a person's input included); then the
            server is told to cancel it ("timed out after <timeout>s"), a request for input
            still open ends ``cancelled``, and the model gets an error result.
        approval_prompt: what a person deciding on a call is shown.
    """

    requires_approval: bool = False
    idempotent: bool = False
    timeout: float | None = None
    approval_prompt: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise UsageError(f"ToolPolicy: timeout must be positive seconds, got {self.timeout!r}")


class MCPTool(Tool[..., Any]):
    """A tool served by an MCP server; built by :class:`MCPServer` from its tool list.

    Attributes:
        server: the server that serves it.
        remote_name: the server's name for it (``name`` may carry the server's prefix).
    """

    def __init__(
        self,
        server: MCPServer,
        *,
        remote_name: str,
        name: str,
        description: str,
        schema: Mapping[str, Any],
        policy: ToolPolicy,
    ) -> None:
        # Not Tool.__init__: there is no Python signature to read; the schema is the server's.
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)  # jsonschema.SchemaError: the server's fault
        self._validator = validator_class(schema)
        self.server = server
        self.remote_name = remote_name
        self.fn = self._send
        self.name = name
        self.description = description
        self.timeout = policy.timeout
        self.requires_approval = policy.requires_approval
        self.idempotent = policy.idempotent
        self.approval_prompt = policy.approval_prompt
        self.approval_expires_after = None
        self.long_running = False
        self._spec = ToolSpec(name=name, description=description, parameters=dict(schema))

    async def _send(self, arguments: dict[str, Any]) -> ToolResult:
        raise NotImplementedError  # pragma: no cover  (the call goes through call())

    def with_options(self, **changes: Unpack[ToolOptions]) -> NoReturn:
        raise UsageError(
            f"MCP tool {self.name!r}: set its options with the server's policy= instead"
        )

    def validate_arguments(self, arguments: str | Mapping[str, Any]) -> str:
        """Check ``arguments`` against the server's ``inputSchema``; return them as JSON text.

        Raises:
            UsageError: not a JSON object, or failing the schema (each bad field is named).
        """
        parsed = self._parse(arguments)
        if isinstance(parsed, str):
            raise UsageError(parsed)
        return json.dumps(parsed)

    def _parse(self, arguments: str | Mapping[str, Any]) -> dict[str, Any] | str:
        """The arguments as a dict, or the message saying what is wrong with them."""
        if isinstance(arguments, Mapping):
            value: object = dict(arguments)
        else:
            try:
                value = json.loads(arguments.strip() or "{}")
            except json.JSONDecodeError as exc:
                return f"Invalid arguments for tool {self.name!r}: not JSON ({exc})"
        if not isinstance(value, dict):
            return f"Invalid arguments for tool {self.name!r}: not a JSON object"
        errors = sorted(self._validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errors:
            parts = []
            for error in errors:
                where = ".".join(str(p) for p in error.absolute_path)
                parts.append(f"{where}: {error.message}" if where else error.message)
            return f"Invalid arguments for tool {self.name!r}: {'; '.join(parts)}"
        return value

    async def call(self, call: ToolCall, context: ToolContext) -> ToolResult:
        """Validate the arguments, send the call to the server, return what the model reads.

        Bad arguments, a server error, the server dying mid-call and the timeout are error
        results naming the tool and server.  A cancel of the invocation propagates as
        ``trio.Cancelled`` once the server has been told (see :meth:`MCPServer.call_tool`).
        """
        arguments = self._parse(call.arguments)
        if isinstance(arguments, str):
            return self._error(call, arguments)
        try:
            text, is_error = await self.server.call_tool(
                self.remote_name,
                arguments,
                progress=context.report_progress,
                ask=context.request_input,
                timeout=self.timeout,
            )
        except MCPServerError as exc:
            return self._error(call, str(exc))
        except trio.TooSlowError:
            # Only the call's own timeout (the invocation's cancel passes as Cancelled).
            return self._error(
                call,
                f"tool {self.name!r} of MCP server {self.server.name!r} timed out after "
                f"{self.timeout:g}s; the server was told to cancel the call",
            )
        return ToolResult(call_id=call.id, name=self.name, content=text, is_error=is_error)

    def __repr__(self) -> str:
        return f"<MCPTool {self.name!r} of {self.server.name!r}>"
