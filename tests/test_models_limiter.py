"""The endpoint rate limiter: one pause and one adaptive concurrency limit per model endpoint.

Unit tests drive :class:`EndpointLimiter` on the mock clock; the integration tests run real
models against the fake servers and compare what the *server* saw (its request records) with
what the limiter allowed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
import trio

import trio_agents as ta
from trio_agents.messages import ModelRequest, UserMessage
from trio_agents.models import (
    Anthropic,
    EndpointLimiter,
    HTTPProvider,
    OpenAIChat,
    RetryPolicy,
    endpoint_limiter,
)
from trio_agents.models._limiter import endpoint_key
from trio_agents.testing import (
    FakeServer,
    RequestRecord,
    ResponsePlan,
    anthropic_error,
    anthropic_stream,
    open_fake_anthropic_server,
    open_fake_openai_server,
    openai_error,
    openai_stream,
)

HELLO = ModelRequest(messages=(UserMessage(text="hi"),))


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


async def test_a_provider_shares_owns_or_disables_its_limiter() -> None:
    """``rate_limiter=None`` (default): the endpoint's shared one; a limiter: that one;
    ``False``: none.  Anything else is a usage error."""
    own = EndpointLimiter()
    url = "http://127.0.0.1:1/v1"
    assert HTTPProvider(base_url=url).current_limiter() is endpoint_limiter(url)
    assert HTTPProvider(base_url=url, rate_limiter=own).current_limiter() is own
    assert HTTPProvider(base_url=url, rate_limiter=False).current_limiter() is None
    with pytest.raises(ta.UsageError, match="rate_limiter"):
        HTTPProvider(base_url=url, rate_limiter=True)  # type: ignore[arg-type]


# --- through real models against the fake servers -----------------------------------------------


def openai_model(server: FakeServer, retry: RetryPolicy | None = None) -> OpenAIChat:
    return OpenAIChat(
        "gpt-test",
        base_url=server.base_url,
        api_key="sk-test",
        retry=retry or RetryPolicy(rng=random.Random(0)),
    )


async def turn(model: OpenAIChat | Anthropic, texts: list[str]) -> None:
    async with model.stream(HELLO) as stream:
        async for _ in stream:
            pass
        texts.append(stream.response.message.text)


def concurrency_at(requests: Sequence[RequestRecord], at: float) -> int:
    """Requests the server had open at ``at`` (opened by then, not yet finished)."""
    return sum(
        1 for r in requests if r.opened_at <= at and (r.finished_at is None or r.finished_at > at)
    )


class Storm:
    """A responder: ``status`` with ``Retry-After`` 1-3 s to 30 % of requests (seeded), else
    ``stream``.  As each request arrives it notes the slots the limiter has handed out (the
    last note of each instant is kept)."""

    def __init__(
        self, status: int, make_error: Callable[..., ResponsePlan], stream: ResponsePlan
    ) -> None:
        self.status = status
        self.make_error = make_error
        self.stream = stream
        self.rng = random.Random(7)
        self.limiter: EndpointLimiter | None = None
        self.in_flight_at: dict[float, int] = {}

    def __call__(self, body: object) -> ResponsePlan:
        if self.limiter is not None:
            self.in_flight_at[trio.current_time()] = self.limiter.statistics().in_flight
        if self.rng.random() < 0.3:
            return self.make_error(self.status, "slow down", retry_after=self.rng.choice([1, 2, 3]))
        return self.stream

    def check(self, server: FakeServer, jobs: int) -> None:
        """What the server saw stayed within what the limiter allowed.

        At every instant a request arrived, each request the server had open held a slot
        (slots are held until the response is closed); after the first rate limit the slots
        never outnumbered the limiter's peak limit; and that peak is below the most requests
        the server had open at once (at the start: all jobs were sent together)."""
        assert self.limiter is not None
        stats = self.limiter.statistics()
        peak = stats.peak_limit_since_first_backoff
        assert peak is not None
        limited = [r for r in server.requests if r.plan and r.plan.status == self.status]
        assert stats.rate_limited == len(limited) > 0
        assert len(server.requests) == jobs + len(limited)
        assert set(self.in_flight_at) == {r.opened_at for r in server.requests}
        first = min(r.finished_at or 0.0 for r in limited)
        for at, in_flight in self.in_flight_at.items():
            assert concurrency_at(server.requests, at) <= in_flight, at
            if at > first:
                assert in_flight <= peak, at
        overall = max(concurrency_at(server.requests, at) for at in self.in_flight_at)
        assert peak < overall
        assert (stats.in_flight, stats.waiting) == (0, 0)


async def test_a_429_storm_ends_with_every_turn_completed(
    autojump_clock: trio.abc.Clock,
) -> None:
    """200 concurrent turns, 30 % of requests answered 429 with ``Retry-After``: every turn
    completes, and after the first 429 the server never sees more requests open than the
    limiter's peak limit, which is below what it saw open at the start."""
    jobs = 200
    storm = Storm(429, openai_error, openai_stream(["a", "b", "c"], delay=0.5))
    texts: list[str] = []
    with trio.fail_after(600):
        async with (
            open_fake_openai_server(responder=storm) as server,
            openai_model(server) as model,
        ):
            storm.limiter = endpoint_limiter(server.base_url)
            async with trio.open_nursery() as nursery:
                for _ in range(jobs):
                    nursery.start_soon(turn, model, texts)
    assert texts == ["abc"] * jobs
    storm.check(server, jobs)
    assert storm.limiter.statistics().decreases >= 2


async def test_a_529_storm_pauses_and_adapts_the_same_way(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Anthropic's 529 (overloaded) pauses the endpoint and lowers its limit as a 429 does.
    Unlike a 429 it is counted against ``max_retries`` (as a 503 is), so the policy here
    allows enough of them."""
    jobs = 100
    storm = Storm(529, anthropic_error, anthropic_stream(["a", "b", "c"], delay=0.5))
    retry = RetryPolicy(max_retries=20, rng=random.Random(0))
    texts: list[str] = []
    with trio.fail_after(600):
        async with open_fake_anthropic_server(responder=storm) as server:
            storm.limiter = endpoint_limiter(server.base_url)
            model = Anthropic("claude-test", base_url=server.base_url, api_key="k", retry=retry)
            async with model, trio.open_nursery() as nursery:
                for _ in range(jobs):
                    nursery.start_soon(turn, model, texts)
    assert texts == ["abc"] * jobs
    storm.check(server, jobs)


async def test_429_forever_fails_after_the_rate_limit_budget(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A server that always answers 429: after ``max_rate_limited_retries`` retries, each
    after the endpoint's pause, the turn fails with :class:`RateLimitError` - no hang."""
    retry = RetryPolicy(max_retries=0, max_rate_limited_retries=4, rng=random.Random(0))
    with trio.fail_after(600):
        async with (
            open_fake_openai_server(
                responder=lambda _: openai_error(429, "no", retry_after=2)
            ) as server,
            openai_model(server, retry) as model,
        ):
            with pytest.raises(ta.RateLimitError) as caught:
                await turn(model, [])
    assert isinstance(caught.value, ta.ModelError)
    assert caught.value.message == "no"
    assert len(server.requests) == 5
    assert [r.opened_at for r in server.requests] == pytest.approx([0, 2, 4, 6, 8], abs=0.01)
    stats = endpoint_limiter(server.base_url).statistics()
    assert (stats.rate_limited, stats.in_flight) == (5, 0)


async def test_429s_do_not_spend_max_retries(autojump_clock: trio.abc.Clock) -> None:
    """With ``max_retries=0``, two 429s are still waited out (their own budget); a 500 is not
    retried."""
    retry = RetryPolicy(max_retries=0, rng=random.Random(0))
    texts: list[str] = []
    with trio.fail_after(60):
        async with open_fake_openai_server() as server, openai_model(server, retry) as model:
            server.enqueue(
                openai_error(429, "slow", retry_after=1),
                openai_error(429, "slow", retry_after=1),
                openai_stream("ok"),
                openai_error(500, "oops"),
            )
            await turn(model, texts)
            with pytest.raises(ta.ServerError):
                await turn(model, texts)
    assert texts == ["ok"]
    assert len(server.requests) == 4


async def test_without_retry_after_the_pause_is_the_policys_backoff(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A 429 with no ``Retry-After`` pauses the endpoint for the policy's jittered backoff."""
    expected = RetryPolicy(rng=random.Random(5)).backoff(0)
    with trio.fail_after(60):
        async with (
            open_fake_openai_server() as server,
            openai_model(server, RetryPolicy(rng=random.Random(5))) as model,
        ):
            server.enqueue(openai_error(429, "slow"), openai_stream("ok"))
            await turn(model, [])
    first, second = server.requests
    assert first.finished_at is not None
    assert second.opened_at - first.finished_at == pytest.approx(expected, abs=0.01)


async def test_a_429_pauses_every_model_of_the_endpoint(autojump_clock: trio.abc.Clock) -> None:
    """One model's 429 (``Retry-After: 5``) holds back another model's new request to the same
    server until t=5; a model whose provider disables the limiter goes at once."""
    texts: list[str] = []
    with trio.fail_after(60):
        async with open_fake_openai_server() as server:
            first = openai_model(server)
            other = openai_model(server)
            alone = OpenAIChat(
                "gpt-test", provider=HTTPProvider(base_url=server.base_url, rate_limiter=False)
            )
            server.enqueue(
                openai_error(429, "slow", retry_after=5),
                openai_stream("alone"),
                openai_stream("first"),
                openai_stream("other"),
            )
            async with first, other, alone, trio.open_nursery() as nursery:
                nursery.start_soon(turn, first, texts)
                await trio.sleep(1.0)
                await turn(alone, texts)
                assert trio.current_time() == pytest.approx(1.0)
                await turn(other, texts)
    assert texts == ["alone", "first", "other"]
    assert [round(r.opened_at, 2) for r in server.requests] == [0.0, 1.0, 5.0, 5.0]


async def test_the_slot_is_held_for_the_whole_turn_and_given_back_on_cancel(
    autojump_clock: trio.abc.Clock,
) -> None:
    """While a turn streams its slot is held; a cancel mid-stream closes the connection (the
    server sees it) and gives the slot back; so does an error answer."""
    with trio.fail_after(60):
        async with open_fake_openai_server() as server, openai_model(server) as model:
            limiter = endpoint_limiter(server.base_url)
            server.enqueue(
                openai_stream(["a", "b", "c"], delay=10.0, first_delay=0.0),
                openai_error(400, "bad"),
            )
            seen: list[int] = []
            with trio.move_on_after(5.0):
                async with model.stream(HELLO) as stream:
                    async for _ in stream:
                        seen.append(limiter.statistics().in_flight)
            assert seen == [1]
            await server.wait_disconnect()
            assert limiter.statistics().in_flight == 0
            with pytest.raises(ta.BadRequestError):
                await turn(model, [])
            assert limiter.statistics().in_flight == 0
