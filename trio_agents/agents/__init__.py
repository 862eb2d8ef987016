"""Orchestration of one invocation's steps (layer 2)."""

from ._context import AgentLike as AgentLike
from ._context import RunContext as RunContext
from .llm import Agent as Agent
from .workflow import Loop as Loop
from .workflow import Parallel as Parallel
from .workflow import Sequential as Sequential
