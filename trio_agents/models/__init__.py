"""Adapters to model servers.  They know one wire format each and nothing of agents."""

from ._base import Model as Model
from ._base import ModelStream as ModelStream
from ._base import ReasoningChunk as ReasoningChunk
from ._base import StreamChunk as StreamChunk
from ._base import TextChunk as TextChunk
from ._base import ToolCallChunk as ToolCallChunk
from .scripted import ScriptedModel as ScriptedModel
from .scripted import ScriptedTurn as ScriptedTurn
