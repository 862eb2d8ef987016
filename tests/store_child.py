"""A second process on the same store, for the cross-process tests.

``python -m tests.store_child follow STORE_URL INVOCATION_ID SEED OUT``: follow the invocation's
events through the store (``Runner.events``), dropping the stream at random points (seeded) and
reattaching after the last id seen, until its terminal event; write each event's wire form to
``OUT``, one per line.

``python -m tests.store_child cancel STORE_URL INVOCATION_ID``: ask for a cancel at once; print
``True`` or ``False``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import trio

from trio_agents import Runner
from trio_agents.events import EventId, encode


async def follow(url: str, invocation_id: str, seed: int, out: Path) -> None:
    rng = random.Random(seed)
    cursor: EventId = (0, 0)
    ended = False
    async with Runner(store=url, owner="follower", cancel_poll_interval=0.05) as runner:
        with out.open("w", encoding="utf-8") as f, trio.fail_after(60):
            while not ended:
                take = rng.randint(1, 6)
                async for event in runner.events(invocation_id, after_seq=cursor):
                    f.write(encode(event) + "\n")
                    cursor = (event.seq, event.sub)
                    ended = event.kind == "ended"
                    take -= 1
                    if take == 0:
                        break  # drop the stream; reattach after the last id seen


async def cancel(url: str, invocation_id: str) -> None:
    async with Runner(store=url, owner="canceller") as runner:
        print(await runner.request_cancel(invocation_id, reason="from another process"))


if __name__ == "__main__":
    verb, url, invocation_id, *rest = sys.argv[1:]
    if verb == "follow":
        trio.run(follow, url, invocation_id, int(rest[0]), Path(rest[1]))
    else:
        trio.run(cancel, url, invocation_id)
