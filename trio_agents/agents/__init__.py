"""Orchestration of one invocation's steps (layer 2)."""

from ._context import RunContext as RunContext
from .llm import Agent as Agent
