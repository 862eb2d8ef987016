"""A turn loop's policy: what a message that arrives mid-turn does (see
:mod:`trio_agents.turnloop`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypeAlias

import attrs

from ._exceptions import UsageError
from .events import CancelMode, MessageReceived, check_cancel_mode

if TYPE_CHECKING:
    from ._invocation import Invocation

__all__ = [
    "Decision",
    "Policy",
    "PolicyDecision",
    "Preempt",
    "check_grace",
    "check_policy",
    "decision",
]


def check_grace(grace: float | None) -> None:
    if grace is not None and not grace >= 0:
        raise UsageError(f"grace must be a number of seconds >= 0, got {grace!r}")


def _check_grace_field(_: object, __: object, grace: float | None) -> None:
    check_grace(grace)


def _check_mode(_: object, __: object, mode: object) -> None:
    check_cancel_mode(mode)


@attrs.frozen
class Preempt:
    """The policy (or a custom policy's decision) that cuts the current turn off: it is
    cancelled with ``mode`` (``grace`` escalates a safe-point mode to ``immediate``), then the
    next turn answers the pending messages."""

    mode: CancelMode = attrs.field(default="immediate", validator=_check_mode)
    grace: float | None = attrs.field(default=None, validator=_check_grace_field)


PolicyDecision: TypeAlias = "Literal['queue', 'coalesce', 'preempt'] | Preempt"
"""What happens to a message that arrives mid-turn."""

Policy: TypeAlias = (
    "Literal['queue', 'coalesce', 'preempt'] | Preempt"
    " | Callable[[Invocation, MessageReceived], PolicyDecision]"
)
"""A loop's policy: a decision for every message, or a callable that decides each one."""

Decision: TypeAlias = "Literal['queue', 'coalesce'] | Preempt"


def decision(value: object, *, what: str) -> Decision:
    if value == "preempt":
        return Preempt()
    if value == "queue" or value == "coalesce":
        return value
    if isinstance(value, Preempt):
        return value
    raise UsageError(
        f"{what} must be 'queue', 'coalesce', 'preempt', a Preempt(...) or (for a policy) a "
        f"callable, got {value!r}"
    )


def check_policy(
    policy: object,
) -> Decision | Callable[[Invocation, MessageReceived], object]:
    """The policy, checked: a decision, or a callable.  Raises :class:`UsageError`."""
    if callable(policy) and not isinstance(policy, Preempt):
        return policy
    return decision(policy, what="a turn loop's policy")
