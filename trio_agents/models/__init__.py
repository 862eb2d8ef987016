"""Adapters to model servers.  They know one wire format each and nothing of agents."""

from ._base import Model as Model
from ._base import ModelStream as ModelStream
from ._base import ReasoningChunk as ReasoningChunk
from ._base import StreamChunk as StreamChunk
from ._base import TextChunk as TextChunk
from ._base import ToolCallChunk as ToolCallChunk
from ._http import HTTPProvider as HTTPProvider
from ._http import RetryPolicy as RetryPolicy
from ._http import Timeouts as Timeouts
from .openai import OpenAIChat as OpenAIChat
from .scripted import ScriptedModel as ScriptedModel
from .scripted import ScriptedTurn as ScriptedTurn
