"""The endpoint rate limiter: one pause and one adaptive concurrency limit per model endpoint.

Unit tests drive :class:`EndpointLimiter` on the mock clock.
"""

from __future__ import annotations

import pytest
import trio

import trio_agents as ta
from trio_agents.models._limiter import EndpointLimiter, endpoint_key, endpoint_limiter


async def hold(
    limiter: EndpointLimiter,
    seconds: float,
    log: list[tuple[str, float]],
    name: str,
) -> None:
    """Take a slot, note when, keep it ``seconds``."""
    async with limiter.slot():
        log.append((name, trio.current_time()))
        await trio.sleep(seconds)


# --- the limiter --------------------------------------------------------------------------------


async def test_no_limit_and_no_wait_until_the_first_rate_limit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A fresh limiter hands out every slot at once and reports no limit; successes change
    nothing."""
    limiter = EndpointLimiter()
    log: list[tuple[str, float]] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(500):
                nursery.start_soon(hold, limiter, 1.0, log, str(i))
            await trio.sleep(0.5)
            stats = limiter.statistics()
            assert (stats.limit, stats.in_flight, stats.waiting) == (None, 500, 0)
            limiter.succeeded()
    assert {at for _, at in log} == {0.0}
    stats = limiter.statistics()
    assert (stats.limit, stats.in_flight, stats.paused_until) == (None, 0, None)
    assert (stats.rate_limited, stats.decreases, stats.peak_limit_since_first_backoff) == (
        0,
        0,
        None,
    )


async def test_a_pause_holds_every_new_request_until_it_ends(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After a rate limit with a 5 s pause, no slot is handed out before t=5, whoever asks and
    whenever; at t=5 the waiters get theirs in the order they came."""
    limiter = EndpointLimiter()
    log: list[tuple[str, float]] = []
    with trio.fail_after(60):
        async with limiter.slot() as slot:
            limiter.rate_limited(5.0, slot=slot)
        assert limiter.statistics().paused_until == 5.0
        async with trio.open_nursery() as nursery:
            for name, at in (("a", 0.0), ("b", 1.0), ("c", 4.9)):
                await trio.sleep_until(at)
                nursery.start_soon(hold, limiter, 0.0, log, name)
    assert log == [("a", 5.0), ("b", 5.0), ("c", 5.0)]
    assert limiter.statistics().paused_until is None


async def test_a_later_rate_limit_extends_the_pause_of_those_waiting(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A pause only grows: a second 429 during the pause moves everyone's start to its end."""
    limiter = EndpointLimiter()
    log: list[tuple[str, float]] = []
    with trio.fail_after(60):
        async with (
            trio.open_nursery() as nursery,
            limiter.slot() as first,
            limiter.slot() as second,
        ):
            limiter.rate_limited(2.0, slot=first)
            nursery.start_soon(hold, limiter, 0.0, log, "waiter")
            await trio.sleep(1.0)
            limiter.rate_limited(6.0, slot=second)  # the pause now ends at t=7
            limiter.rate_limited(1.0)  # a shorter one changes nothing
    assert log == [("waiter", 7.0)]


async def test_a_pause_that_begins_behind_the_limit_still_ends(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A task queued behind the limit when a pause begins, whose slot frees up during the
    pause, starts when the pause ends (nobody releases anything then)."""
    limiter = EndpointLimiter(limit=1)
    log: list[tuple[str, float]] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            async with limiter.slot() as slot:
                nursery.start_soon(hold, limiter, 0.0, log, "waiter")
                await trio.sleep(1.0)
                limiter.rate_limited(4.0, slot=slot)  # paused until t=5
            assert limiter.statistics().waiting == 1
    assert log == [("waiter", 5.0)]


async def test_the_limit_decreases_once_per_pause_window(autojump_clock: trio.abc.Clock) -> None:
    """Ten requests sent together all get 429: one decrease (to half of those in flight).  A
    request sent after that decrease and rate limited again halves the limit once more."""
    limiter = EndpointLimiter()
    with trio.fail_after(60):
        slots = [limiter.slot() for _ in range(10)]
        for slot in slots:
            await slot.__aenter__()
        for slot in slots:
            limiter.rate_limited(1.0, slot=slot)
            await slot.__aexit__(None, None, None)
        stats = limiter.statistics()
        assert (stats.limit, stats.rate_limited, stats.decreases) == (5, 10, 1)
        async with limiter.slot() as late:
            assert trio.current_time() == 1.0  # it waited out the pause
            limiter.rate_limited(1.0, slot=late)
    stats = limiter.statistics()
    assert (stats.limit, stats.rate_limited, stats.decreases) == (2, 11, 2)
    assert stats.peak_limit_since_first_backoff == 5


async def test_without_a_slot_only_a_rate_limit_outside_a_pause_decreases(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``rate_limited`` without a slot: news only when the endpoint is not paused already."""
    limiter = EndpointLimiter(limit=40)
    limiter.rate_limited(3.0)
    limiter.rate_limited(3.0)
    assert (limiter.statistics().limit, limiter.statistics().decreases) == (20, 1)
    await trio.sleep(3.0)
    limiter.rate_limited(3.0)
    assert (limiter.statistics().limit, limiter.statistics().decreases) == (10, 2)


async def test_the_limit_recovers_by_one_after_limit_successes(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Additive increase: +1 after ``limit`` successes, and the peak follows it."""
    limiter = EndpointLimiter(limit=8)
    for _ in range(20):
        limiter.succeeded()  # a limit given at the start is no backoff: no peak yet
    assert (limiter.statistics().limit, limiter.statistics().peak_limit_since_first_backoff) == (
        10,
        None,
    )
    limiter.rate_limited(0.0)
    assert limiter.statistics().limit == 5
    for _ in range(5 + 6 - 1):
        limiter.succeeded()
    assert limiter.statistics().limit == 6
    limiter.succeeded()
    stats = limiter.statistics()
    assert (stats.limit, stats.peak_limit_since_first_backoff) == (7, 7)


async def test_slots_go_first_come_first_served_up_to_the_limit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """With a limit of 2, six requests run two at a time, in the order they asked."""
    limiter = EndpointLimiter(limit=2)
    log: list[tuple[str, float]] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(hold, limiter, 1.0, log, str(i))
                await trio.sleep(0.01)
    assert [name for name, _ in log] == ["0", "1", "2", "3", "4", "5"]
    starts = [round(at, 2) for _, at in log]
    assert starts == [0.0, 0.01, 1.0, 1.01, 2.0, 2.01]


async def test_a_success_that_raises_the_limit_lets_a_waiter_in(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Room made by a higher limit is handed out at once, not at the next release."""
    limiter = EndpointLimiter(limit=1)
    log: list[tuple[str, float]] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery, limiter.slot():
            nursery.start_soon(hold, limiter, 0.0, log, "waiter")
            await trio.sleep(1.0)
            limiter.succeeded()  # limit 1 -> 2
            await trio.sleep(1.0)
    assert log == [("waiter", 1.0)]


async def test_a_cancel_while_waiting_ends_at_once_and_leaves_no_trace(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Cancelled in the queue behind the limit: the wait ends at the cancel, the queue forgets
    the task, and the next one is served as if it had never been there."""
    limiter = EndpointLimiter(limit=1)
    log: list[tuple[str, float]] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery, limiter.slot():
            with trio.move_on_after(1.0) as scope:
                await hold(limiter, 0.0, log, "never")
            assert scope.cancelled_caught
            assert trio.current_time() == 1.0
            nursery.start_soon(hold, limiter, 0.0, log, "next")
            await trio.sleep(1.0)
            stats = limiter.statistics()
            assert (stats.in_flight, stats.waiting) == (1, 1)
    assert log == [("next", 2.0)]
    assert (limiter.statistics().in_flight, limiter.statistics().waiting) == (0, 0)


async def test_a_cancel_of_the_first_waiter_hands_the_clock_to_the_next(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The first waiter sleeps until the pause ends; the others wait to be woken.  If the
    first is cancelled, the next one takes over and still starts when the pause ends."""
    limiter = EndpointLimiter()
    log: list[tuple[str, float]] = []
    with trio.fail_after(60):
        async with limiter.slot() as slot:
            limiter.rate_limited(5.0, slot=slot)
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(1.0):
                async with trio.open_nursery() as doomed:
                    doomed.start_soon(hold, limiter, 0.0, log, "first")
                    await trio.sleep(0.1)
                    nursery.start_soon(hold, limiter, 0.0, log, "next")
                    await trio.sleep_forever()
    assert log == [("next", 5.0)]


async def test_the_slot_context_manager_is_used_once(autojump_clock: trio.abc.Clock) -> None:
    """A slot is one request's: holding it twice is a usage error; so is asking the epoch of a
    slot never held."""
    limiter = EndpointLimiter()
    slot = limiter.slot()
    with pytest.raises(ta.UsageError, match="never held"):
        _ = slot.epoch
    async with slot:
        pass
    with pytest.raises(ta.UsageError, match="only once"):
        async with slot:
            pass
    assert limiter.statistics().in_flight == 0


def test_bad_settings_are_usage_errors() -> None:
    """Factors outside (0, 1), a minimum under 1, a start limit under the minimum."""
    for kw in ({"decrease_factor": 1.0}, {"min_limit": 0}, {"limit": 1, "min_limit": 2}):
        with pytest.raises(ta.UsageError):
            EndpointLimiter(**kw)


# --- one limiter per endpoint per run -----------------------------------------------------------


def test_an_endpoint_is_scheme_host_port_and_base_path() -> None:
    """Case, default ports and a trailing slash do not make a new endpoint; a path does."""
    assert endpoint_key("HTTPS://API.example.com/v1/") == "https://api.example.com:443/v1"
    assert endpoint_key("http://h:80/v1") == endpoint_key("http://h/v1")
    assert endpoint_key("http://h:8080/v1") != endpoint_key("http://h/v1")
    assert endpoint_key("http://h/v2") != endpoint_key("http://h/v1")
    assert endpoint_key("http://[::1]:9/") == "http://[::1]:9"
    with pytest.raises(ta.UsageError):
        endpoint_key("http://h:port/v1")


def test_each_trio_run_has_its_own_limiters() -> None:
    """One limiter per endpoint within a run; a new run starts afresh (trio objects never
    cross runs)."""

    async def main() -> tuple[EndpointLimiter, bool, bool]:
        limiter = endpoint_limiter("http://h/v1")
        same = endpoint_limiter("http://H:80/v1/") is limiter
        other = endpoint_limiter("http://h/v2") is not limiter
        return limiter, same, other

    first, same, other = trio.run(main)
    second, _, _ = trio.run(main)
    assert same
    assert other
    assert first is not second
