"""One cursor over a turn loop's life (see :mod:`trio_agents.turnloop`)."""

from __future__ import annotations

from collections.abc import Callable

from ._exceptions import UsageError
from ._recorder import Recorder
from ._stream import EventStream
from .events import (
    Event,
    EventId,
    InvocationEnded,
    InvocationStarted,
    LoopTurnStarted,
    parse_event_id,
)
from .stores._base import Store

__all__ = ["LoopEventStream", "id_text"]


def id_text(key: EventId) -> str:
    seq, sub = key
    return f"{seq}.{sub}" if sub else str(seq)


class LoopEventStream:
    """Every event of a turn loop after a cursor, then live: the loop's events and, after
    each ``loop_turn_started``, that turn's events up to its ``ended`` event.

    :attr:`cursor` is where a reader resumes: ``"12"`` after the loop's event 12 (or after
    the whole turn that event 12 started), ``"12/41.3"`` after event ``41.3`` of the turn
    event 12 started.  Made by :meth:`TurnLoop.events` and :meth:`Runner.loop_events`.

    A turn whose loop died with it and that a later opening of the loop resumed has two
    claims: the first, whose part of the turn ends where the resumed run begins (its
    ``started`` event says ``by_loop``), and the resumed one, which reads on from there.  So
    every event of the turn is read once, in id order, whatever cursor a reader starts from.
    """

    def __init__(
        self,
        store: Store,
        loop_id: str,
        after: str | int | None = None,
        *,
        live: Recorder | None,
        live_turn: Callable[[str], Recorder | None],
        poll_interval: float,
    ) -> None:
        self._store = store
        self._loop_id = loop_id
        self._live_turn = live_turn
        self._poll_interval = poll_interval
        marker, inner = _parse_cursor(after)
        self._marker = marker
        self._inner = inner  # where in the turn marker started (None: not in one)
        self._reopen = inner is not None  # the turn's stream is made at the first read
        self._loop = EventStream(
            store,
            loop_id,
            (marker, 0),
            live=live,
            poll_interval=poll_interval,
            this_run_only_ends=live is not None,
        )
        self._turn: EventStream | None = None
        self._claimed_run: EventId | None = None  # the started event of a resumed claim's run

    @property
    def cursor(self) -> str:
        if self._inner is None:
            return str(self._marker)
        return f"{self._marker}/{id_text(self._inner)}"

    def __aiter__(self) -> LoopEventStream:
        return self

    def _follow_turn(self, claim: LoopTurnStarted, after: EventId) -> None:
        """Read ``claim``'s turn after ``after``, up to its next ending - or up to the start
        of a later run that another claim of the loop (a resumed one) reads."""
        claimed_after = parse_event_id(claim.after)
        self._claimed_run = (claimed_after[0] + 1, 0) if claim.resumed else None
        turn_id = claim.turn_id
        self._turn = EventStream(
            self._store,
            turn_id,
            after,
            live=self._live_turn(turn_id),
            poll_interval=self._poll_interval,
        )

    async def __anext__(self) -> Event:
        if self._reopen:
            self._reopen = False
            found = await self._store.load_events(self._loop_id, after_seq=self._marker - 1)
            claim = found[0] if found else None
            if not isinstance(claim, LoopTurnStarted) or claim.seq != self._marker:
                raise UsageError(
                    f"cursor {self.cursor!r}: event {self._marker} of turn loop "
                    f"{self._loop_id!r} is not the start of a turn"
                )
            assert self._inner is not None
            self._follow_turn(claim, self._inner)
        if self._turn is not None:
            try:
                event = await self._turn.__anext__()
            except StopAsyncIteration:  # its run ended here without a stored end
                event = None
            if (
                isinstance(event, InvocationStarted)
                and event.by_loop
                and (event.seq, event.sub) != self._claimed_run
            ):
                event = None  # a run its loop resumed: its resumed claim reads it
            if event is not None:
                self._inner = (event.seq, event.sub)
                if isinstance(event, InvocationEnded):
                    self._turn = None
                    self._inner = None
                return event
            self._turn = None
            self._inner = None
        event = await self._loop.__anext__()
        self._marker = event.seq
        self._inner = None
        if isinstance(event, LoopTurnStarted):
            after = parse_event_id(event.after)
            self._inner = after
            self._follow_turn(event, after)
        return event


def _parse_cursor(value: str | int | None) -> tuple[int, EventId | None]:
    if value is None:
        return 0, None
    if isinstance(value, str):
        marker, slash, inner = value.strip().partition("/")
        if "." not in marker:  # the marker is a seq of the loop, never an ephemeral id
            try:
                return parse_event_id(marker)[0], parse_event_id(inner) if slash else None
            except UsageError:
                pass
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return parse_event_id(value)[0], None
        except UsageError:
            pass
    raise UsageError(
        f"a turn loop cursor is '12' or '12/41.3' (from LoopEventStream.cursor), got {value!r}"
    )
