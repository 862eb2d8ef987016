"""Where and how to reach one model server: :class:`HTTPProvider`.

The wire format is a model class's business (``OpenAIChat``, ``Anthropic``, ...); sending is
:class:`~._http.HTTPSession`'s.  This module only holds the settings, and names the
``httpx2`` client type for type checkers only (:mod:`._http` stays the one module that imports
``httpx2``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import attrs

from .._exceptions import UsageError
from ._config import RetryPolicy, Timeouts
from ._limiter import EndpointLimiter, endpoint_limiter

if TYPE_CHECKING:
    from ._http import HTTPClient

__all__ = ["HTTPProvider"]


def _check_base_url(instance: object, attribute: object, value: str) -> None:
    if not value.startswith(("http://", "https://")):
        raise UsageError(f"base_url must start with http:// or https://, got {value!r}")


def _check_rate_limiter(instance: object, attribute: object, value: object) -> None:
    if value is not None and value is not False and not isinstance(value, EndpointLimiter):
        raise UsageError(
            f"rate_limiter must be an EndpointLimiter, None (shared) or False, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class HTTPProvider:
    """Where and how to reach one model server; the wire format is the model class's business.

    Attributes:
        base_url: e.g. ``https://api.openai.com/v1``; request paths are appended to it.
        api_key: the credential; the model class decides which header carries it.
        headers: extra headers sent with every request (they win over the defaults).
        timeout: see :class:`~._config.Timeouts`.
        retry: see :class:`~._config.RetryPolicy`.
        http_client: an ``httpx2.AsyncClient`` to use (its transport, limits and proxies; our
            :class:`~._config.Timeouts` still apply per request).  An injected client belongs
            to the caller and is never closed by us; without one, the
            :class:`~._http.HTTPSession` makes one when it is opened and closes it when the
            last holder leaves.
        max_connections: connection limit of a client we make ourselves (``None``: no limit).
        rate_limiter: ``None`` (the default): requests go through the endpoint's shared
            :class:`~._limiter.EndpointLimiter` (:func:`~._limiter.endpoint_limiter`: one per
            endpoint per ``trio.run``, so every model and task of the process that talks to
            this server waits out its 429s together); an :class:`~._limiter.EndpointLimiter`:
            that one (it belongs to one ``trio.run``); ``False``: none, each request backs off
            on its own.
    """

    base_url: str = attrs.field(validator=_check_base_url)
    api_key: str | None = attrs.field(default=None, repr=False)
    headers: Mapping[str, str] = attrs.field(factory=dict)
    timeout: Timeouts = Timeouts()
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    http_client: HTTPClient | None = attrs.field(default=None, eq=False, repr=False)
    max_connections: int | None = 1000
    rate_limiter: EndpointLimiter | Literal[False] | None = attrs.field(
        default=None, eq=False, repr=False, validator=_check_rate_limiter
    )

    def url(self, path: str) -> str:
        """``base_url`` joined with ``path`` by exactly one slash."""
        return f"{self.base_url.rstrip('/')}/{path.lstrip('/')}"

    def current_limiter(self) -> EndpointLimiter | None:
        """The limiter this provider's requests go through in the current ``trio.run`` (see
        :attr:`rate_limiter`); ``None`` when disabled.  Must be called inside ``trio.run``."""
        if self.rate_limiter is None:
            return endpoint_limiter(self.base_url)
        return self.rate_limiter or None
