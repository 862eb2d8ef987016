"""Adapters to model servers.  They know one wire format each and nothing of agents."""

from ._base import Model as Model
from ._base import ModelStream as ModelStream
from ._base import ReasoningChunk as ReasoningChunk
from ._base import StreamChunk as StreamChunk
from ._base import TextChunk as TextChunk
from ._base import ToolCallChunk as ToolCallChunk
from ._config import RetryPolicy as RetryPolicy
from ._config import Timeouts as Timeouts
from ._limiter import EndpointLimiter as EndpointLimiter
from ._limiter import LimiterStatistics as LimiterStatistics
from ._limiter import RequestSlot as RequestSlot
from ._limiter import endpoint_limiter as endpoint_limiter
from ._provider import HTTPProvider as HTTPProvider
from .anthropic import Anthropic as Anthropic
from .openai import OpenAIChat as OpenAIChat
from .openai_responses import OpenAIResponses as OpenAIResponses
from .scripted import ScriptedModel as ScriptedModel
from .scripted import ScriptedTurn as ScriptedTurn
