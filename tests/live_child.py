"""The child process of the live-session kill test: open a live session, get through one turn,
start a second, print the session id once its audio flows, then wait to be killed.

``python -m tests.live_child STORE_URL REALTIME_URL [SESSION_ID]`` (with a session id, the live
session is part of that session's conversation)
"""

from __future__ import annotations

import sys

import trio

import trio_agents as ta
from trio_agents.live import LiveAgent, LiveAudio, LiveTurnDone, open_live
from trio_agents.models import OpenAIRealtime


async def main(store: str, url: str, session_id: str | None) -> None:
    agent = LiveAgent(name="voice", model=OpenAIRealtime("gpt-realtime", base_url=url))
    async with (
        ta.Runner(store=store, lease_ttl=1.0) as runner,
        open_live(runner, agent, session_id=session_id) as live,
    ):
        await live.send_text("hello")
        while not isinstance(await live.receive(), LiveTurnDone):
            pass
        await live.send_text("a long story please")
        while not isinstance(await live.receive(), LiveAudio):
            pass
        print(live.id, flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
