"""Helpers shared by the tests (not fixtures: plain functions)."""

from __future__ import annotations

import trio

from trio_agents.events import Event, InvocationEnded


def live_task_names() -> list[str]:
    """Names of every task alive in this trio run, found by walking the task tree."""
    names: list[str] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return names


def terminal_events(events: list[Event]) -> list[InvocationEnded]:
    return [e for e in events if isinstance(e, InvocationEnded)]
