"""The shell every HTTP model shares: settings, the session, opening and closing.

A model class (``OpenAIChat``, ``OpenAIResponses``, ``Anthropic``) adds only its wire format:
the request body, the headers, the path and its stream parser.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Self

from .._exceptions import UsageError
from ._config import RetryPolicy, Timeouts
from ._http import HTTPClient, HTTPProvider, HTTPSession

__all__ = ["HTTPModel", "provider_from_env"]


def provider_from_env(
    *,
    base_url: str | None,
    api_key: str | None,
    headers: Mapping[str, str] | None,
    http_client: HTTPClient | None,
    timeout: Timeouts | None,
    retry: RetryPolicy | None,
    base_url_env: str,
    api_key_env: str,
    default_base_url: str,
) -> HTTPProvider:
    """An :class:`HTTPProvider` from the arguments, then the environment (as the vendors' SDKs
    read it: ``base_url_env`` / ``api_key_env``), then ``default_base_url``."""
    return HTTPProvider(
        base_url=base_url or os.environ.get(base_url_env) or default_base_url,
        api_key=api_key if api_key is not None else os.environ.get(api_key_env),
        headers=dict(headers or {}),
        timeout=timeout or Timeouts(),
        retry=retry or RetryPolicy(),
        http_client=http_client,
    )


class HTTPModel:
    """Base of the models that stream over HTTP.

    Owns an :class:`HTTPSession` for ``http_provider``.  The model is an async context manager
    and opens nest: the first ``async with model`` makes its HTTP client (unless the provider
    carries an injected one, which stays the caller's and is never closed here), the last exit
    closes it, and a later ``async with`` makes a fresh one.  A :class:`~trio_agents.Runner`
    opens the models of the agents it runs; outside a runner, open the model yourself.
    :meth:`stream` on a model that is not open raises :class:`~trio_agents.UsageError`.
    ``wire`` is the wire-format name that errors carry (``"openai"``, ``"anthropic"``).
    """

    def __init__(self, model: str, *, http_provider: HTTPProvider, wire: str) -> None:
        if not model:
            raise UsageError(f"{type(self).__name__} needs a model name")
        self._model = model
        self._wire = wire
        self.http_provider = http_provider
        self._session = HTTPSession(http_provider, provider=wire)

    @staticmethod
    def check_settings(owner: str, provider: HTTPProvider | None, *settings: object) -> None:
        """A full ``provider=`` plus a loose setting is ambiguous: :class:`UsageError`."""
        if provider is not None and any(s is not None for s in settings):
            raise UsageError(
                f"{owner}: pass either provider= or base_url/api_key/headers/http_client/"
                "timeout/retry, not both"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._model!r}, base_url={self.http_provider.base_url!r})"

    @property
    def name(self) -> str:
        return self._model

    @property
    def provider(self) -> str:
        return self._wire

    @property
    def http_client(self) -> HTTPClient:
        """The client this model streams through while open (its own, or the injected one).
        Raises :class:`~trio_agents.UsageError` when the model is not open."""
        return self._require_open().client

    def _require_open(self) -> HTTPSession:
        """The session, which must be open: what :meth:`stream` goes through.  Raises
        :class:`~trio_agents.UsageError` saying how to open the model when it is not."""
        if not self._session.is_open:
            raise UsageError(
                f"model {self._model!r} is not open: use `async with model:` or run it through "
                "a Runner, which opens the models of the agents it runs"
            )
        return self._session

    async def __aenter__(self) -> Self:
        """Open the model (the first holder makes the HTTP client).  A cancel here leaves
        nothing open."""
        await self._session.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Leave; the last holder closes the client the model made (shielded, bounded)."""
        await self._session.__aexit__(exc_type, exc_value, traceback)
