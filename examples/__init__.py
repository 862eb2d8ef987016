"""Runnable examples: ``trio-agents run examples.weather:agent "..."``."""
