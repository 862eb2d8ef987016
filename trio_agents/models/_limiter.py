"""One adaptive rate limiter per model endpoint, shared by every task of a ``trio.run``.

A 429 (rate limited) or 529 (overloaded) from a model server is news for every request to that
server, not only for the one that got it.  :class:`EndpointLimiter` turns it into two things:

- a **pause**: no new request to the endpoint starts before the time the server asked for
  (``Retry-After`` / ``retry-after-ms``, else the :class:`~._config.RetryPolicy` backoff);
- an **adaptive concurrency limit**: unlimited until the first rate limit; then multiplicative
  decrease (at most once per pause window: only a request that started after the last decrease
  can decrease again) and additive recovery (+1 after ``limit`` successful requests).

:func:`endpoint_limiter` keeps one limiter per endpoint (scheme, host, port and base path of the
base URL) per ``trio.run``, in a :class:`trio.lowlevel.RunVar`: trio objects never cross runs.
:func:`send_attempts` is how :class:`~._http.HTTPSession` sends: every attempt holds a slot from
before its request is sent until its response is closed, and rate-limited retries wait for the
endpoint's pause under their own budget (``RetryPolicy.max_rate_limited_retries``).

Nothing here imports ``httpx2``; the attempt itself is a callable the HTTP layer passes in.
"""

from __future__ import annotations

import logging
import math
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Final, Self, TypeVar

import attrs
import trio

from .._exceptions import ModelError, UsageError
from ._config import RetryPolicy

__all__ = [
    "RATE_LIMIT_STATUSES",
    "EndpointLimiter",
    "LimiterStatistics",
    "RequestSlot",
    "endpoint_key",
    "endpoint_limiter",
    "send_attempts",
]

logger = logging.getLogger("trio_agents.models")

#: Statuses that pause the endpoint and lower its limit: 429 (rate limited) and 529
#: (Anthropic's "overloaded").  503 stays an ordinary retryable error.
RATE_LIMIT_STATUSES: Final = frozenset({429, 529})

_Result = TypeVar("_Result")


@attrs.frozen(kw_only=True)
class LimiterStatistics:
    """A snapshot of an :class:`EndpointLimiter` (from :meth:`EndpointLimiter.statistics`).

    Attributes:
        limit: requests allowed in flight at once; ``None``: no limit (no rate limit seen yet).
        in_flight: slots held now.
        waiting: tasks queued for a slot.
        paused_until: the ``trio.current_time()`` before which no new request starts; ``None``
            when the endpoint is not paused.
        rate_limited: rate-limited answers reported so far.
        decreases: how many times the limit was lowered.
        peak_limit_since_first_backoff: the largest limit allowed at any time since the first
            decrease (``None`` before it).
    """

    limit: int | None
    in_flight: int
    waiting: int
    paused_until: float | None
    rate_limited: int
    decreases: int
    peak_limit_since_first_backoff: int | None


class _Waiter:
    """A task queued for a slot.  ``wakeup`` is replaced before each wait; it is set when the
    task is handed a slot (:meth:`grant`) or must look at the pause again."""

    __slots__ = ("_epoch", "wakeup")

    def __init__(self) -> None:
        self._epoch: int | None = None
        self.wakeup = trio.Event()

    def granted(self) -> int | None:
        """The epoch the task was handed a slot in; ``None`` while it waits.  (A method: what
        it says changes while the task sleeps, which a type checker's narrowing cannot see.)"""
        return self._epoch

    def grant(self, epoch: int) -> None:
        self._epoch = epoch
        self.wakeup.set()


class EndpointLimiter:
    """The pause and the adaptive concurrency limit of one model endpoint.

    Hold a slot per request with ``async with limiter.slot() as slot:``; report a rate-limited
    answer with :meth:`rate_limited` (passing the slot) and a successful one with
    :meth:`succeeded`.  Slots are handed out first come, first served, and only while the
    endpoint is not paused and fewer than ``limit`` are held.

    Args:
        limit: the starting limit; ``None`` (the default): no limit until the first rate limit,
            so an endpoint that never answers 429 costs one checkpoint per request.
        decrease_factor: on a decrease the limit becomes ``limit * decrease_factor`` (rounded
            down); the first time, ``in_flight * decrease_factor``.
        min_limit: the limit never goes below this.

    A limiter belongs to one ``trio.run`` (its times are that run's clock).  Use
    :func:`endpoint_limiter` for the shared one of an endpoint.
    """

    def __init__(
        self, *, limit: int | None = None, decrease_factor: float = 0.5, min_limit: int = 1
    ) -> None:
        if not 0.0 < decrease_factor < 1.0:
            raise UsageError(f"decrease_factor must be between 0 and 1, got {decrease_factor}")
        if min_limit < 1:
            raise UsageError(f"min_limit must be at least 1, got {min_limit}")
        if limit is not None and limit < min_limit:
            raise UsageError(f"limit must be at least min_limit ({min_limit}), got {limit}")
        self._limit = limit
        self._decrease_factor = decrease_factor
        self._min_limit = min_limit
        self._in_flight = 0
        self._queue: deque[_Waiter] = deque()
        self._paused_until = -math.inf
        self._epoch = 0  # the number of decreases: a slot remembers the value it was given at
        self._rate_limited = 0
        self._successes = 0  # since the last change of the limit
        self._peak: int | None = None

    def __repr__(self) -> str:
        return f"<EndpointLimiter limit={self._limit} in_flight={self._in_flight}>"

    def slot(self) -> RequestSlot:
        """A slot for one request: ``async with limiter.slot() as slot:`` waits for it."""
        return RequestSlot(self)

    def rate_limited(self, pause: float, *, slot: RequestSlot | None = None) -> None:
        """Report a rate-limited answer: pause new requests for ``pause`` seconds from now
        (a pause only ever grows), and lower the limit if this is news.

        ``slot`` is the slot the rate-limited request held (held still, or just released).
        The limit is lowered only if it was not lowered since that slot was handed out, so a
        burst of 429s to requests sent together lowers it once.  Without a slot, the limit is
        lowered only if the endpoint is not paused already.
        """
        now = trio.current_time()
        if slot is None:
            news = self._paused_until <= now
        else:
            news = slot.epoch == self._epoch
        self._rate_limited += 1
        if news:
            base = self._in_flight if self._limit is None else self._limit
            limit = max(self._min_limit, int(base * self._decrease_factor))
            self._set_limit(limit)
            self._peak = max(self._peak or 0, limit)
            self._epoch += 1
        until = now + max(pause, 0.0)
        if until > self._paused_until:
            self._paused_until = until
            # The first waiter keeps the time of the pause's end: tell it the new one.
            if self._queue:
                self._queue[0].wakeup.set()

    def succeeded(self) -> None:
        """Report a successful answer: after ``limit`` of them the limit grows by one."""
        if self._limit is None:
            return
        self._successes += 1
        if self._successes >= self._limit:
            self._set_limit(self._limit + 1)
            self._dispatch()

    def statistics(self) -> LimiterStatistics:
        """A snapshot of the limiter's state (see :class:`LimiterStatistics`)."""
        paused = self._paused_until > trio.current_time()
        return LimiterStatistics(
            limit=self._limit,
            in_flight=self._in_flight,
            waiting=len(self._queue),
            paused_until=self._paused_until if paused else None,
            rate_limited=self._rate_limited,
            decreases=self._epoch,
            peak_limit_since_first_backoff=self._peak,
        )

    def _set_limit(self, limit: int) -> None:
        self._limit = limit
        self._successes = 0
        if self._peak is not None:  # counted from the first decrease on
            self._peak = max(self._peak, limit)

    def _dispatch(self) -> None:
        """Hand free slots to the queue's first waiters, unless the endpoint is paused."""
        if not self._queue or self._paused_until > trio.current_time():
            return
        while self._queue and (self._limit is None or self._in_flight < self._limit):
            self._in_flight += 1
            self._queue.popleft().grant(self._epoch)

    async def _acquire(self) -> int:
        """Wait for a slot; returns the epoch it was handed out in.  A cancel while waiting
        leaves the queue as if the task had never come."""
        await trio.lowlevel.checkpoint_if_cancelled()
        waiter = _Waiter()
        self._queue.append(waiter)
        self._dispatch()
        epoch = waiter.granted()
        if epoch is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return epoch
        acquired = False
        try:
            while (epoch := waiter.granted()) is None:
                waiter.wakeup = trio.Event()
                # Only the first waiter watches the clock: when the pause ends it hands out the
                # free slots, in order.  The others wait to be handed one.
                deadline = math.inf
                if waiter is self._queue[0] and self._paused_until > trio.current_time():
                    deadline = self._paused_until
                with trio.move_on_at(deadline):
                    await waiter.wakeup.wait()
                if waiter.granted() is None:
                    self._dispatch()
            acquired = True
        finally:
            if not acquired:
                self._abandon(waiter)
        return epoch

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.granted() is not None:  # handed a slot as the cancel came: give it back
            self._release()
            return
        was_first = waiter is self._queue[0]
        self._queue.remove(waiter)
        if was_first and self._queue:
            self._queue[0].wakeup.set()  # the new first waiter takes over the clock

    def _release(self) -> None:
        self._in_flight -= 1
        self._dispatch()


class RequestSlot:
    """One request's slot in an :class:`EndpointLimiter`; made by :meth:`EndpointLimiter.slot`.

    ``async with slot:`` waits until the endpoint is not paused and has a free slot (first come,
    first served), and leaving the block gives the slot back, whatever ends it.  A cancel while
    waiting ends the wait at once and leaves no trace.  A slot is used once.
    """

    __slots__ = ("_epoch", "_held", "_limiter")

    def __init__(self, limiter: EndpointLimiter) -> None:
        self._limiter = limiter
        self._epoch: int | None = None
        self._held = False

    @property
    def epoch(self) -> int:
        """How many decreases the limiter had made when it handed this slot out."""
        if self._epoch is None:
            raise UsageError("this request slot was never held")
        return self._epoch

    async def acquire(self) -> None:
        """Wait for the slot (what ``async with slot:`` does on entry)."""
        if self._epoch is not None:
            raise UsageError("a request slot can be held only once")
        self._epoch = await self._limiter._acquire()
        self._held = True

    def release(self) -> None:
        """Give the slot back, if it is held (what leaving ``async with slot:`` does)."""
        if self._held:
            self._held = False
            self._limiter._release()

    async def __aenter__(self) -> Self:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


# --- one limiter per endpoint per run -----------------------------------------------------------

_LIMITERS: trio.lowlevel.RunVar[dict[str, EndpointLimiter]] = trio.lowlevel.RunVar(
    "trio_agents.models.endpoint_limiters"
)

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def endpoint_key(base_url: str) -> str:
    """The endpoint a base URL names: scheme, host, port and path, normalized
    (``http://API.example:80/v1/`` and ``http://api.example/v1`` are one endpoint)."""
    parts = urllib.parse.urlsplit(base_url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"base_url has an invalid port: {base_url!r}") from exc
    host = (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        raise UsageError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}{parts.path.rstrip('/')}"


def endpoint_limiter(base_url: str) -> EndpointLimiter:
    """The shared :class:`EndpointLimiter` of ``base_url``'s endpoint in the current
    ``trio.run``, made on first use (see :func:`endpoint_key`).  Every
    :class:`~._http.HTTPProvider` without its own ``rate_limiter`` goes through it.  Must be
    called inside ``trio.run``."""
    key = endpoint_key(base_url)
    try:
        limiters = _LIMITERS.get()
    except LookupError:
        limiters = {}
        _LIMITERS.set(limiters)
    limiter = limiters.get(key)
    if limiter is None:
        limiter = limiters[key] = EndpointLimiter()
    return limiter


# --- sending through the limiter ----------------------------------------------------------------


async def send_attempts(
    send: Callable[[], Awaitable[_Result]],
    *,
    policy: RetryPolicy,
    limiter: EndpointLimiter | None,
    url: str,
) -> tuple[_Result, RequestSlot | None]:
    """Call ``send()`` until an attempt succeeds; return its result and the slot it holds.

    ``send`` makes one attempt: it returns the open response, or raises a
    :class:`~trio_agents.ModelError`, having closed whatever it opened.  Each attempt holds a
    slot of ``limiter`` (``None``: no limiter, and no slot) from before ``send`` is called.  A
    failed attempt's slot is given back here; the successful one's is returned held, and the
    caller gives it back (:meth:`RequestSlot.release`) once it has closed the response,
    whatever ends its use (normally, on an error or on cancel).

    A retryable 429 or 529 is reported to the limiter while its slot is still held, then the
    slot is given back and the retry waits for the endpoint's pause and a free slot.  A 429
    counts against ``policy.max_rate_limited_retries``; every other retryable error (529
    included) against ``policy.max_retries``, and sleeps its own backoff as before.  When the
    budget is spent, the last error is raised.  Nothing here catches ``trio.Cancelled`` but to
    give the slot back and re-raise it: a cancel while waiting for a slot, a pause or a
    backoff ends the wait at once.
    """
    retries = 0
    rate_limited_retries = 0
    while True:
        slot = None
        if limiter is not None:
            slot = limiter.slot()
            await slot.acquire()
        try:
            result = await send()
        except ModelError as exc:
            error = exc
            own_budget = exc.status_code in RATE_LIMIT_STATUSES
            retry = rate_limited_retries if own_budget else retries
            pause: float | None = None
            try:
                limited = exc.retryable and exc.status_code in RATE_LIMIT_STATUSES
                if limited and limiter is not None and slot is not None:
                    # Told even when this request will not retry: the others should wait.
                    pause = policy.backoff(retry, exc.retry_after)
                    limiter.rate_limited(pause, slot=slot)
            finally:
                if slot is not None:
                    slot.release()
        except BaseException:  # a cancel, or a bug in ``send``: give the slot back, re-raise
            if slot is not None:
                slot.release()
            raise
        else:
            if limiter is not None:
                limiter.succeeded()
            return result, slot
        budget = policy.max_rate_limited_retries if own_budget else policy.max_retries
        if not error.retryable or retry >= budget:
            raise error
        if pause is not None:
            # The next slot is handed out after the endpoint's pause, however long it grew.
            logger.info("retrying %s after a pause of %.2fs or more: %s", url, pause, error)
        else:
            delay = policy.backoff(retry, error.retry_after)
            logger.info("retrying %s in %.2fs after: %s", url, delay, error)
            # A plain sleep: a cancel (or the turn deadline) ends the backoff at once.
            await trio.sleep(delay)
        if own_budget:
            rate_limited_retries += 1
        else:
            retries += 1
