"""Fields of a JSON request body, by their snake_case name or ADK's camelCase one.

ADK's clients send ``appName``, ``userId``, ``sessionId``, ``newMessage``; ours may send
``app_name`` ... : both are read, and a body that sends both spellings of one field with
different values is refused.  A field of the wrong type answers 422 ``invalid_field`` naming
it; a missing required one 422 ``missing_field``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._errors import ApiError
from ._ids import check_id

__all__ = ["camel", "get_bool", "get_id", "get_number", "get_object", "get_str", "raw"]


def camel(name: str) -> str:
    """``"app_name"`` -> ``"appName"``."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def invalid(name: str, wanted: str, value: object) -> ApiError:
    shown = "null" if value is None else type(value).__name__
    return ApiError(422, "invalid_field", f"field {name!r} must be {wanted}, got {shown}")


def raw(body: Mapping[str, Any], name: str, *, required: bool = False) -> Any:
    """The value of ``name`` (or its camelCase spelling); ``None`` when absent."""
    alias = camel(name)
    values = [body[key] for key in dict.fromkeys((name, alias)) if key in body]
    if len(values) == 2 and values[0] != values[1]:
        raise ApiError(
            422, "invalid_field", f"fields {name!r} and {alias!r} are one field; send one"
        )
    if not values or values[0] is None:
        if required:
            raise ApiError(422, "missing_field", f"field {name!r} is required")
        return None
    return values[0]


def get_str(body: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = raw(body, name, required=required)
    if value is not None and not isinstance(value, str):
        raise invalid(name, "a string", value)
    return value


def get_id(body: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    """A string field that is an id (app, user, session): 400 for a bad id."""
    value = get_str(body, name, required=required)
    return None if value is None else check_id(value, f"field {name!r}")


def get_bool(body: Mapping[str, Any], name: str, *, default: bool) -> bool:
    value = raw(body, name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, "true or false", value)
    return value


def get_number(body: Mapping[str, Any], name: str) -> float | None:
    """A non-negative number, or ``None``."""
    value = raw(body, name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise invalid(name, "a non-negative number", value)
    return float(value)


def get_object(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    value = raw(body, name)
    if value is not None and not isinstance(value, dict):
        raise invalid(name, "an object", value)
    return value
