"""Bearer tokens mapped to user ids.

Tokens come from a file (``--tokens FILE``: a JSON object ``{"token": "user"}``, or lines of
``token user``) or from the environment (``TRIO_AGENTS_TOKENS="token1=alice,token2=bob"``).
"""

from __future__ import annotations

import hmac
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from .._exceptions import UsageError
from ._errors import ApiError
from ._ids import ID_PATTERN, check_id

__all__ = ["TOKENS_ENV", "Auth", "load_tokens"]

TOKENS_ENV = "TRIO_AGENTS_TOKENS"

_USER = re.compile(ID_PATTERN)


def _parse(text: str, source: str) -> dict[str, str]:
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{source}: not valid JSON: {exc}") from exc
        pairs = list(data.items())
    else:
        pairs = []
        for number, line in enumerate(re.split(r"[\n,]", text), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            token, sep, user = line.replace("=", " ", 1).partition(" ")
            if not sep:
                raise UsageError(f"{source}: entry {number} is not 'token user': {line!r}")
            pairs.append((token.strip(), user.strip()))
    tokens: dict[str, str] = {}
    for token, user in pairs:
        if not isinstance(token, str) or len(token) < 8:
            raise UsageError(f"{source}: a token must be a str of at least 8 characters")
        check_user = isinstance(user, str) and bool(_USER.fullmatch(user))
        if not check_user:
            raise UsageError(f"{source}: {user!r} is not a usable user id")
        tokens[token] = user
    return tokens


def load_tokens(path: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Tokens from ``path`` if given, else from ``$TRIO_AGENTS_TOKENS`` (``{}`` if unset).

    Raises :class:`~trio_agents.UsageError` naming the file or variable and the bad entry.
    """
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the tokens file {os.fspath(path)!r}: {exc}") from exc
        return _parse(text, os.fspath(path))
    return _parse(os.environ.get(TOKENS_ENV, ""), f"${TOKENS_ENV}")


class Auth:
    """Who a request is.  With ``insecure_dev`` and no token, the user the request names
    (its path or body) is believed: for a developer on 127.0.0.1 only."""

    def __init__(self, tokens: Mapping[str, str], *, insecure_dev: bool = False) -> None:
        for user in tokens.values():
            check_id(user, "a token's user id")
        self._tokens = dict(tokens)
        self.insecure_dev = insecure_dev

    def user(self, authorization: str | None, *, claimed: str | None = None) -> str:
        """The user id of a request with this ``Authorization`` header.

        ``claimed`` is the user the request names (path or body); without a token it is
        believed in ``insecure_dev`` mode (``"dev"`` if it names none).  Raises a 401
        :class:`ApiError` for a missing or unknown token.
        """
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise _unauthorized("the Authorization header must be 'Bearer <token>'")
            token = token.strip()
            for known, user in self._tokens.items():
                if hmac.compare_digest(known.encode(), token.encode()):
                    return user
            raise _unauthorized("unknown token")
        if self.insecure_dev:
            return claimed or "dev"
        raise _unauthorized("no token: send 'Authorization: Bearer <token>'")


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})
