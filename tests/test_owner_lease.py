"""One lease row per owner: a live owner's renewal round moves its own row, not its invocations'.

See "Owners" in :mod:`trio_agents.stores._base`.  Every store (the ``case`` fixture: memory,
SQLite file, real PostgreSQL), store clocks moved by hand; the race of a takeover and a renewal
at the expiry instant on real PostgreSQL with two stores (two pools: two processes).
"""

from __future__ import annotations

import random
from typing import Any, cast

import pytest
import trio

from trio_agents import Agent, LeaseError, Runner, SessionBusy, StoreUnavailableError
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import (
    InvocationRecord,
    Lease,
    MemoryStore,
    OwnerLapses,
    OwnerLeases,
    PostgresStore,
)

from .conftest import StoreCase

TTL = 30.0


def record(invocation_id: str, owner: str = "a", **fields: Any) -> InvocationRecord:
    return InvocationRecord(id=invocation_id, agent="ops", input="go", owner=owner, **fields)


async def renewed(case: StoreCase, leases: list[Lease]) -> list[Lease]:
    results = await case.store.renew_leases(leases, ttl=TTL)
    assert all(isinstance(r, Lease) for r in results), results
    return [r for r in results if isinstance(r, Lease)]


async def rows(case: StoreCase) -> dict[str, Any]:
    """What each invocation row holds, as stored (not as read): its own lease expiry and
    ``updated_at`` (memory: the stored record itself), and PostgreSQL's ``xmin`` (the
    transaction that last wrote the row)."""
    if isinstance(case.store, MemoryStore):
        return dict(case.store._records)
    extra = ", xmin::text" if case.kind == "postgres" else ""
    found = await case.raw(f"SELECT id, lease_expires_at, updated_at{extra} FROM invocations")
    return {row[0]: row[1:] for row in found}


def owners(case: StoreCase) -> OwnerLeases:
    """The store, as one that renews an owner's row alone (each store here does)."""
    assert callable(getattr(type(case.store), "renew_owner", None))
    return cast(OwnerLeases, case.store)


async def start(case: StoreCase, ids: list[str], owner: str = "a") -> list[Lease]:
    return [await case.store.create_invocation(record(i, owner), ttl=TTL) for i in ids]


async def test_a_live_owners_round_touches_no_invocation_row(case: StoreCase) -> None:
    """The first round stamps the owner's generation on its rows (row by row); every round
    after it, while the owner lives, moves the owner's row alone: the invocation rows stay as
    they were, yet each reads with the renewed expiry and none can be taken over."""
    ids = [f"i{k}" for k in range(20)]
    first = await renewed(case, await start(case, ids))
    assert {lease.owner_gen for lease in first} == {2}  # entered lapsed (1), revived
    before = await rows(case)
    leases = first
    for _ in range(3):
        case.clock.advance(TTL / 3)
        leases = await renewed(case, leases)
    assert await rows(case) == before, "a round of a live owner wrote invocation rows"
    assert [lease.expires_at for lease in leases] == [case.clock.now + TTL] * len(ids)
    for lease in leases:
        got = await case.store.get_invocation(lease.invocation_id)
        assert got.lease_expires_at == case.clock.now + TTL
    listed = await case.store.list_invocations(status="running")
    assert {r.lease_expires_at for r in listed} == {case.clock.now + TTL}
    # Their own rows expired long ago; the owner's row covers them.
    case.clock.advance(TTL - 1)
    assert await case.store.orphans(["ops"]) == []
    with pytest.raises(LeaseError, match=r"owned by 'a' for another 1\.0s"):
        await case.store.acquire_lease("i3", owner="b", ttl=TTL)
    case.clock.advance(1)
    assert [r.id for r in await case.store.orphans(["ops"], limit=5)] == sorted(ids)[:5]


async def test_a_slow_owner_is_fenced_out_of_what_was_taken_and_keeps_the_rest(
    case: StoreCase,
) -> None:
    """The owner's row lapses; another owner takes one invocation over.  The old owner's next
    round runs row by row: a LeaseError for that one, the others renewed under a new
    generation, and its writes to the taken one are refused."""
    leases = await renewed(case, await start(case, ["x", "y", "z"]))
    case.clock.advance(TTL + 1)
    assert [r.id for r in await case.store.orphans(["ops"])] == ["x", "y", "z"]
    taken = await case.store.acquire_lease("y", owner="b", ttl=TTL, expect_epoch=1)
    assert taken.epoch == 2
    results = await case.store.renew_leases(leases, ttl=TTL)
    assert isinstance(results[1], LeaseError)
    assert "taken over by 'b'" in str(results[1])
    kept = [r for r in results if isinstance(r, Lease)]
    assert [r.invocation_id for r in kept] == ["x", "z"]
    assert {r.owner_gen for r in kept} == {4}  # 2, bumped by the takeover, revived
    with pytest.raises(LeaseError):
        await case.store.renew_lease(leases[1], ttl=TTL)
    # Live again: the next round is the owner's row alone, and fences nobody.
    case.clock.advance(5)
    assert [r.expires_at for r in await renewed(case, kept)] == [case.clock.now + TTL] * 2
    assert await case.store.orphans(["ops"]) == []


async def test_a_takeover_of_a_covered_invocation_sends_its_owner_row_by_row(
    case: StoreCase,
) -> None:
    """An owner takes its own running invocation again (a new epoch) while its row is live:
    the generation moves on, so a round with the old lease is fenced row by row instead of
    renewed on the owner's row."""
    leases = await renewed(case, await start(case, ["x", "y"]))
    again = await case.store.acquire_lease("x", owner="a", ttl=TTL)
    results = await case.store.renew_leases(leases, ttl=TTL)
    assert isinstance(results[0], LeaseError)
    assert isinstance(results[1], Lease)
    assert again.epoch == 2


async def test_an_invocation_its_owner_stopped_renewing_is_an_orphan_after_a_lapse(
    case: StoreCase,
) -> None:
    """The owner stops renewing ``x`` (its ending could not be stored) and its row lapses;
    when the owner comes back (a round of the others, or a start), its row gets a new
    generation: ``x`` is not covered again, and is an orphan once its own lease lapsed."""
    leases = await renewed(case, await start(case, ["x", "y"]))
    case.clock.advance(TTL + 1)
    await renewed(case, leases[1:])  # the owner is back; x is not in its round
    await start(case, ["w"])  # a start of the owner's does not cover x again either
    assert [r.id for r in await case.store.orphans(["ops"])] == ["x"]
    got = await case.store.get_invocation("x")
    assert got.lease_expires_at < case.clock.now
    assert (await case.store.acquire_lease("x", owner="b", ttl=TTL, expect_epoch=1)).epoch == 2


async def test_a_session_is_busy_while_its_owner_lives(case: StoreCase) -> None:
    """The session-busy check reads the effective expiry: an invocation whose own row
    lapsed long ago, covered by its live owner, keeps its session busy."""
    lease = await case.store.create_invocation(record("x", session_id="s"), ttl=TTL)
    [lease] = await renewed(case, [lease])
    for _ in range(6):
        case.clock.advance(TTL / 2)
        [lease] = await renewed(case, [lease])
    with pytest.raises(SessionBusy):
        await case.store.create_invocation(record("z", owner="b", session_id="s"), ttl=TTL)
    case.clock.advance(TTL + 1)
    await case.store.create_invocation(record("z", owner="b", session_id="s"), ttl=TTL)


async def test_a_start_before_its_owners_first_round_keeps_its_own_lease(
    case: StoreCase,
) -> None:
    """An owner that never renewed has a lapsed row (entered by its first start, so the
    orphan query finds what it ran): its invocation keeps its own expiry, an orphan once
    that lapsed - as a row that ran before owners had rows (an upgraded database) does."""
    [lease] = await start(case, ["x"], owner="old")
    assert lease.owner_gen == 0
    case.clock.advance(TTL - 1)
    assert await case.store.orphans(["ops"]) == []
    case.clock.advance(1)
    assert [r.id for r in await case.store.orphans(["ops"])] == ["x"]
    [back] = await renewed(case, [lease])  # row by row: it was still x's owner
    assert back.owner_gen == 2
    assert await case.store.orphans(["ops"]) == []


# ---- renew_owner: the owner's row alone, without the leases ---------------------------------


async def test_renew_owner_renews_every_covered_invocation_and_writes_none(
    case: StoreCase,
) -> None:
    """``renew_owner`` with the generation its rows carry: one row moves, every covered
    invocation reads with the new expiry (none can be taken over, none is an orphan), and no
    invocation row is written; it says when the renewal was counted from."""
    ids = [f"i{k}" for k in range(5)]
    [gen] = {lease.owner_gen for lease in await renewed(case, await start(case, ids))}
    before = await rows(case)
    for _ in range(3):
        case.clock.advance(TTL / 3)
        got = await owners(case).renew_owner("a", gen, ttl=TTL)
        assert got is not None
        assert (got.owner, got.gen, got.expires_at) == ("a", gen, case.clock.now + TTL)
        assert got.counted_from is not None
    assert await rows(case) == before, "renew_owner wrote invocation rows"
    for i in ids:
        assert (await case.store.get_invocation(i)).lease_expires_at == case.clock.now + TTL
    case.clock.advance(TTL - 1)
    assert await case.store.orphans(["ops"]) == []
    with pytest.raises(LeaseError):
        await case.store.acquire_lease("i0", owner="b", ttl=TTL)
    # An invocation started now is stamped with the same generation: covered too.
    [fresh] = await start(case, ["late"])
    assert fresh.owner_gen == gen
    assert await owners(case).renew_owner("a", gen, ttl=TTL) is not None
    case.clock.advance(TTL - 1)
    assert await case.store.orphans(["ops"]) == []


async def test_renew_owner_says_no_for_a_lapsed_row_or_another_generation(
    case: StoreCase,
) -> None:
    """``None``, changing nothing, when the owner's row lapsed (a takeover may be under way:
    the orphans stay orphans), for a generation a takeover moved on, for generation 0 and
    for an owner with no row; then ``renew_leases`` fences each lease and revives the row
    under a new generation, which ``renew_owner`` renews again."""
    leases = await renewed(case, await start(case, ["x", "y"]))
    gen = leases[0].owner_gen
    assert await owners(case).renew_owner("a", 0, ttl=TTL) is None
    assert await owners(case).renew_owner("nobody", gen, ttl=TTL) is None
    assert await owners(case).renew_owner("a", gen + 1, ttl=TTL) is None
    case.clock.advance(TTL + 1)
    assert await owners(case).renew_owner("a", gen, ttl=TTL) is None
    assert [r.id for r in await case.store.orphans(["ops"])] == ["x", "y"]
    taken = await case.store.acquire_lease("y", owner="b", ttl=TTL, expect_epoch=1)
    assert await owners(case).renew_owner("a", gen, ttl=TTL) is None
    results = await case.store.renew_leases(leases, ttl=TTL)
    assert isinstance(results[1], LeaseError)
    [kept] = [r for r in results if isinstance(r, Lease)]
    assert kept.owner_gen > gen
    assert await owners(case).renew_owner("a", gen, ttl=TTL) is None  # the old one: never again
    case.clock.advance(TTL / 3)
    assert await owners(case).renew_owner("a", kept.owner_gen, ttl=TTL) is not None
    assert (await case.store.get_invocation("x")).lease_expires_at == case.clock.now + TTL
    assert (await case.store.get_invocation("y")).owner == taken.owner == "b"


# ---- PostgreSQL: a renewal and a takeover at the expiry instant -------------------------------

ROUNDS = 40


async def race(
    a: PostgresStore,
    b: PostgresStore,
    leases: list[Any],
    invocation_id: str,
    rnd: random.Random,
    call: str = "renew_leases",
) -> dict[str, Any]:
    """``a`` renews ``leases`` (``call``: all of them, or their owner's row alone) while ``b``
    takes ``invocation_id`` over, each after a random pause of a few milliseconds; what each
    got."""
    got: dict[str, Any] = {}

    async def renew() -> None:
        await trio.sleep(rnd.uniform(0, 0.004))
        if call == "renew_owner":
            got["renew"] = await a.renew_owner(leases[0].owner, leases[0].owner_gen, ttl=TTL)
        else:
            got["renew"] = await a.renew_leases(leases, ttl=TTL)

    async def take() -> None:
        await trio.sleep(rnd.uniform(0, 0.004))
        try:
            got["take"] = await b.acquire_lease(invocation_id, owner="b", ttl=TTL, expect_epoch=1)
        except LeaseError as exc:
            got["take"] = exc

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(renew)
            nursery.start_soon(take)
    return got


@pytest.mark.postgres
@pytest.mark.parametrize("call", ["renew_leases", "renew_owner"])
async def test_a_takeover_racing_a_renewal_at_the_expiry_instant_never_makes_two_holders(
    postgres_url: str, postgres_schema: str, call: str
) -> None:
    """Store ``a`` (the owner) renews a just-before-expiry round while store ``b`` takes one
    of its invocations over just after, on separate connections, in random order and with
    random clocks either side of the owner's expiry: never both (a renewal that read its
    clock first and committed second would otherwise renew a run ``b`` holds).  Exactly
    one wins each round, and the loser's answer is a LeaseError (``renew_owner``: ``None``,
    the round then goes row by row)."""
    rnd = random.Random()
    clock_a, clock_b = [1_700_000_000.0], [1_700_000_000.0]
    async with (
        PostgresStore(postgres_url, schema=postgres_schema, clock=lambda: clock_a[0]) as a,
        PostgresStore(postgres_url, schema=postgres_schema, clock=lambda: clock_b[0]) as b,
    ):
        for k in range(ROUNDS):
            base = 1_700_000_000.0 + k * 1000
            clock_a[0] = clock_b[0] = base
            others = [f"r{k}-{j}" for j in range(3)]
            created = [
                await a.create_invocation(record(i, owner=f"a{k}"), ttl=TTL)
                for i in [f"r{k}-x", *others]
            ]
            stamped = await a.renew_leases(created, ttl=TTL)
            assert all(isinstance(r, Lease) and r.owner_gen for r in stamped)
            expiry = base + TTL
            clock_a[0] = expiry - rnd.uniform(0, 0.01)
            clock_b[0] = expiry + rnd.uniform(0, 0.01)
            got = await race(a, b, stamped, f"r{k}-x", rnd, call)
            took = isinstance(got["take"], Lease)
            if call == "renew_owner":
                renewed_x = got["renew"] is not None
            else:
                renewed_x = isinstance(got["renew"][0], Lease)
                assert all(isinstance(r, Lease) for r in got["renew"][1:])
            assert renewed_x != took, (k, got)
            # And the store agrees with the winner.
            [(owner,)] = await a._execute(
                ("SELECT owner FROM invocations WHERE id = ?", (f"r{k}-x",))
            )
            assert owner == ("b" if took else f"a{k}")
        assert a.reruns + b.reruns == 0


async def test_a_released_lease_is_an_orphan_at_once_while_its_owner_lives(
    case: StoreCase,
) -> None:
    """``release_lease``: the invocation is no longer covered by its (live) owner's row and
    its own expiry is now; a stale lease, or an ended invocation's, changes nothing."""
    first = await renewed(case, await start(case, ["i1", "i2"]))
    case.clock.advance(TTL / 3)
    leases = await renewed(case, first)  # the owner lives, covering both
    assert await case.store.orphans(["ops"]) == []
    assert await case.store.release_lease(leases[0]) is True
    assert [r.id for r in await case.store.orphans(["ops"])] == ["i1"]
    assert (await case.store.get_invocation("i2")).lease_expires_at == case.clock.now + TTL
    taken = await case.store.acquire_lease("i1", owner="b", ttl=TTL)
    assert taken.epoch == leases[0].epoch + 1
    assert await case.store.release_lease(leases[0]) is False  # stale: b holds it now
    assert (await case.store.get_invocation("i1")).owner == "b"
    assert await case.store.orphans(["ops"]) == []


class FailEndingOf:
    """A store whose write of ``invocation_id``'s terminal event fails (the store was away)."""

    def __init__(self, inner: Any, invocation_id: str) -> None:
        self._inner = inner
        self.invocation_id = invocation_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit(self, writes: Any) -> list[Any]:
        from trio_agents.events import InvocationEnded
        from trio_agents.stores._base import JournalWrite

        ending = [
            w
            for w in writes
            if isinstance(w, JournalWrite)
            and w.lease.invocation_id == self.invocation_id
            and any(isinstance(e, InvocationEnded) for e in w.events)
        ]
        if ending:
            return [StoreUnavailableError("the store went away") for _ in writes]
        result: list[Any] = await self._inner.commit(writes)
        return result


async def test_an_invocation_dropped_unended_is_given_back_while_its_runner_lives(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An invocation whose ending cannot be stored is dropped by its runner; the runner lives
    on (another invocation runs) and its owner row would cover the dropped one for good.  The
    next renewal round gives its lease back: an orphan, for any recovering runner."""
    inner = MemoryStore(clock=trio.current_time)
    store = FailEndingOf(inner, "quick")
    slow = Agent(name="ops", model=ScriptedModel([ScriptedTurn.text("x" * 40, pieces=40, delay=5)]))
    quick = Agent(name="ops", model=ScriptedModel(["done"]))
    async with Runner(store=store, lease_ttl=TTL) as runner:
        long = await runner.start(slow, "go")
        await trio.sleep(TTL / 3 + 1)  # the owner's first round: its row now covers starts
        dropped = await runner.start(quick, "go", invocation_id="quick")
        outcome = await dropped.wait()
        assert outcome.checkpoint_id is None  # its ending was not stored
        assert (await inner.get_invocation("quick")).status == "running"
        await trio.sleep(TTL / 3 + 1)  # a round
        assert [r.id for r in await inner.orphans(["ops"])] == ["quick"]
        assert (await inner.get_invocation(long.id)).lease_expires_at > trio.current_time()
        long.cancel()
        await long.wait()


# ---- next_lapse: when the next runner's row runs out ----------------------------------------


async def test_next_lapse_is_the_first_live_row_of_another_owner(case: StoreCase) -> None:
    """Seconds until the first live owner row but the caller's lapses: rows made live by a
    round count, the caller's own and lapsed ones do not, and none says ``None``."""
    lapses = cast(OwnerLapses, case.store)
    assert callable(getattr(type(case.store), "next_lapse", None))
    assert await lapses.next_lapse(excluding="me") is None
    await renewed(case, await start(case, ["a1"], owner="a"))  # a's row: live until now + TTL
    case.clock.advance(5)
    await renewed(case, await start(case, ["b1"], owner="b"))  # b's: until now + TTL
    assert await lapses.next_lapse(excluding="me") == pytest.approx(TTL - 5)
    assert await lapses.next_lapse(excluding="a") == pytest.approx(TTL)
    case.clock.advance(TTL - 4)  # a's row lapsed
    assert await lapses.next_lapse(excluding="me") == pytest.approx(4)
    assert await lapses.next_lapse(excluding="b") is None
