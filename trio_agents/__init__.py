"""trio_agents: a runtime for LLM agents built on Trio's structured concurrency."""

from . import events as events
from . import models as models
from ._exceptions import *  # noqa: F403  (the error tree is public as a whole; see _exceptions)
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

__version__ = "0.1.0.dev0"
