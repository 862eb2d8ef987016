"""The public names are pinned: adding or removing one is a deliberate change."""

from __future__ import annotations

import pytest

import trio_agents as ta

PUBLIC = {
    "Agent", "AssistantMessage", "AuthenticationError", "BadRequestError", "Batch",
    "BatchNotFound", "CancelMode", "Job", "Progress", "batch",
    "CorruptRecordError", "EventStream", "GateClosed", "Hooks", "Invocation", "InvocationInfo",
    "InvocationNotFound", "LeaseError", "Loop", "LoopEventStream", "MalformedStreamError",
    "MaxTurnsExceeded", "Message", "ModelConnectionError", "ModelError", "ModelRequest",
    "ModelResponse", "ModelStatusError", "ModelTimeoutError", "NeedsCredential", "NotFoundError",
    "Outcome", "OverloadedError", "Parallel", "Preempt", "RateLimitError", "Runner", "Sequential",
    "ServerError", "SessionBusy", "SessionNotFound", "StoreError", "StoreUnavailableError",
    "StreamBrokenError", "StreamErrorEvent", "Tool", "ToolCall", "ToolContext", "ToolError",
    "ToolResult", "ToolResultMessage", "ToolSpec", "TrioAgentsError", "TurnLoop", "Usage",
    "UsageError", "UserMessage", "events", "models", "stores", "tool",
}  # fmt: skip


def test_public_names_are_pinned() -> None:
    exported = {name for name in vars(ta) if not name.startswith("_")}
    # submodules bound by import
    exported -= {"agents", "approvals", "hooks", "live", "messages", "runner", "tools", "turnloop"}
    assert exported == PUBLIC | ({"testing", "server", "cli", "otel", "a2a", "mcp"} & exported)


def test_the_server_loads_on_first_use() -> None:
    """``ta.server`` works after ``import trio_agents`` alone (imported on first use)."""
    assert ta.server.create_app.__module__ == "trio_agents.server._create"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = ta.nope


def test_otel_loads_on_first_use() -> None:
    """``ta.otel`` works after ``import trio_agents`` alone; its public names are pinned."""
    assert ta.otel.OTelHooks.__module__ == "trio_agents.otel"
    assert set(ta.otel.__all__) == {"OTelHooks", "Telemetry", "configure"}
    assert isinstance(ta.otel.OTelHooks(), ta.Hooks)


def test_every_error_is_in_the_tree() -> None:
    for name in PUBLIC:
        obj = getattr(ta, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, ta.TrioAgentsError), name
