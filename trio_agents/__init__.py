"""trio_agents: a runtime for LLM agents built on Trio's structured concurrency.

Every agent invocation is one structured-concurrency unit: ``invocation.cancel()`` closes the
model's HTTP stream, cancels its tools, and ends it exactly once; what happened before the end
is journaled and resumable in any process.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import batch as batch
from . import events as events
from . import models as models
from . import stores as stores
from ._exceptions import AuthenticationError as AuthenticationError
from ._exceptions import BadRequestError as BadRequestError
from ._exceptions import BatchNotFound as BatchNotFound
from ._exceptions import CorruptRecordError as CorruptRecordError
from ._exceptions import GateClosed as GateClosed
from ._exceptions import InvocationNotFound as InvocationNotFound
from ._exceptions import LeaseError as LeaseError
from ._exceptions import MalformedStreamError as MalformedStreamError
from ._exceptions import MaxTurnsExceeded as MaxTurnsExceeded
from ._exceptions import ModelConnectionError as ModelConnectionError
from ._exceptions import ModelError as ModelError
from ._exceptions import ModelStatusError as ModelStatusError
from ._exceptions import ModelTimeoutError as ModelTimeoutError
from ._exceptions import NeedsCredential as NeedsCredential
from ._exceptions import NotFoundError as NotFoundError
from ._exceptions import OverloadedError as OverloadedError
from ._exceptions import RateLimitError as RateLimitError
from ._exceptions import ServerError as ServerError
from ._exceptions import SessionBusy as SessionBusy
from ._exceptions import SessionNotFound as SessionNotFound
from ._exceptions import StoreError as StoreError
from ._exceptions import StoreUnavailableError as StoreUnavailableError
from ._exceptions import StreamBrokenError as StreamBrokenError
from ._exceptions import StreamErrorEvent as StreamErrorEvent
from ._exceptions import ToolError as ToolError
from ._exceptions import TrioAgentsError as TrioAgentsError
from ._exceptions import UsageError as UsageError
from .agents import Agent as Agent
from .agents import Loop as Loop
from .agents import Parallel as Parallel
from .agents import Sequential as Sequential
from .batch import Batch as Batch
from .batch import Progress as Progress
from .hooks import Hooks as Hooks
from .hooks import InvocationInfo as InvocationInfo
from .messages import AssistantMessage as AssistantMessage
from .messages import Message as Message
from .messages import ModelRequest as ModelRequest
from .messages import ModelResponse as ModelResponse
from .messages import ToolCall as ToolCall
from .messages import ToolResult as ToolResult
from .messages import ToolResultMessage as ToolResultMessage
from .messages import ToolSpec as ToolSpec
from .messages import Usage as Usage
from .messages import UserMessage as UserMessage
from .runner import CancelMode as CancelMode
from .runner import EventStream as EventStream
from .runner import Invocation as Invocation
from .runner import Outcome as Outcome
from .runner import Runner as Runner
from .stores import Job as Job
from .tools import Tool as Tool
from .tools import ToolContext as ToolContext
from .tools import tool as tool
from .turnloop import LoopEventStream as LoopEventStream
from .turnloop import Preempt as Preempt
from .turnloop import TurnLoop as TurnLoop

__version__ = "0.1.0.dev0"

if _TYPE_CHECKING:
    from . import a2a as a2a
    from . import mcp as mcp
    from . import otel as otel
    from . import server as server


def __getattr__(name: str) -> object:
    # `ta.server` is imported on first use: the web stack (Starlette, Hypercorn) is not
    # loaded by programs that never serve.
    # `ta.otel` likewise: OpenTelemetry's API is loaded only by programs that trace.
    # `ta.a2a` likewise: the a2a-sdk's types are loaded only by programs that call A2A agents.
    # `ta.mcp` likewise: the MCP SDK is loaded only by programs that use MCP servers.
    if name in ("server", "otel", "a2a", "mcp"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
