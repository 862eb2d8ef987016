"""Ids and text at the edge: what a client may send as an id, and the one character no text
may hold.

Every id a request names - in its path, its body, a WebSocket's query or frame - is checked
against its pattern before anything is looked up (the same patterns ``/openapi.json``
documents):

* apps, users and sessions: :data:`ID_PATTERN`, 1-128 letters, digits, ``.``, ``_``, ``@``
  or ``-``, starting with a letter or digit;
* invocations: :data:`INVOCATION_ID_PATTERN`, 1-64 letters, digits, ``_`` or ``-`` (what
  the runner and batches make; an invocation started by a library caller with another id
  is not reachable over HTTP);
* approvals: :data:`APPROVAL_ID_PATTERN`, 1-512 characters, no control characters (a
  workflow's approval id holds ``/`` and ``:``).

An id that breaks its pattern names nothing that can exist: the answer is 400 ``bad_id``
naming the parameter (a path that leaves an id empty matches no route: 404 ``not_found``).

No text a client sends may hold U+0000 (NUL): PostgreSQL's text cannot store it, and an
answer must not depend on the store.  A JSON body (or WebSocket frame) with a NUL in any
string - value or key - is 400 ``bad_text`` naming where (:func:`check_text`).
"""

from __future__ import annotations

import re
from typing import Any, Final

from starlette.requests import HTTPConnection

from ._errors import ApiError

__all__ = [
    "APPROVAL_ID_PATTERN",
    "ID_PATTERN",
    "INVOCATION_ID_PATTERN",
    "check_id",
    "check_text",
    "path_id",
    "shortened",
]

ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}"
INVOCATION_ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
APPROVAL_ID_PATTERN: Final = r"[^\x00-\x1f\x7f]{1,512}"

_KINDS: Final[dict[str, tuple[re.Pattern[str], str]]] = {
    "id": (
        re.compile(ID_PATTERN),
        "1-128 characters of letters, digits, '.', '_', '@' or '-' (starting with a letter "
        "or digit)",
    ),
    "invocation": (
        re.compile(INVOCATION_ID_PATTERN),
        "1-64 characters of letters, digits, '_' or '-' (starting with a letter or digit)",
    ),
    "approval": (re.compile(APPROVAL_ID_PATTERN), "1-512 characters, none of them a control"),
}
_PATH_KINDS: Final = {"invocation_id": "invocation", "approval_id": "approval"}


def shortened(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut short (with its length) when longer than ``limit``: an error
    message must not echo a 5,000-character id back whole."""
    shown = repr(value)
    return shown if len(shown) <= limit else f"{shown[: limit - 3]}... ({len(shown)} characters)"


def check_id(value: object, what: str, kind: str = "id") -> str:
    """``value`` if it is an id of ``kind`` (``"id"``, ``"invocation"``, ``"approval"``),
    else a 400 ``bad_id`` naming ``what``."""
    pattern, rule = _KINDS[kind]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ApiError(400, "bad_id", f"{what} must be {rule}, got {shortened(value)}")
    return value


def path_id(conn: HTTPConnection, name: str) -> str:
    """The path parameter ``name``, checked (400 ``bad_id`` naming it)."""
    return check_id(conn.path_params[name], f"path parameter {name!r}", _PATH_KINDS.get(name, "id"))


def check_text(value: Any, where: str = "the body") -> None:
    """Raise 400 ``bad_text`` naming the place (``field 'new_message.parts[0].text'``) if any
    string in the JSON ``value`` (keys too) holds U+0000."""
    found = _nul_at(value, "")
    if found is not None:
        place = f"field {shortened(found)}" if found else where
        raise ApiError(
            400,
            "bad_text",
            f"{place} holds the NUL character (U+0000), which no text sent here may hold",
        )


def _nul_at(value: Any, path: str) -> str | None:
    """The path of the first string holding NUL in ``value``, else ``None``.  Iterative: a
    body nested as deep as the JSON parser allows must not exhaust the stack here."""
    todo: list[tuple[Any, str]] = [(value, path)]
    while todo:
        item, where = todo.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where
        elif isinstance(item, dict):
            for key, inner in item.items():
                place = f"{where}.{key}" if where else str(key)
                if "\x00" in str(key):
                    return place.replace("\x00", "\\x00")
                todo.append((inner, place))
        elif isinstance(item, list):
            todo.extend((inner, f"{where}[{i}]") for i, inner in enumerate(item))
    return None
