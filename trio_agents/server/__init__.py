"""The server: HTTP, SSE and WebSocket in front of a :class:`~trio_agents.Runner` (layer 4).

A Starlette app served by Hypercorn's trio worker.  It translates between transports and the
runner and holds no agent logic::

    async with ta.Runner("sqlite:///agents.db", agents=[agent]) as runner:
        app = ta.server.create_app([agent], runner=runner, tokens={"s3cret": "alice"})
        await ta.server.serve(app, host="127.0.0.1", port=8000)

or ``trio-agents serve mymodule:agent --store sqlite:///agents.db``.

Who owns what
-------------
* **Invocations belong to the runner, never to a request.**  ``POST /run_sse`` starts the
  invocation in the runner's nursery, then *follows* it (``runner.events``) to the terminal
  frame.  A client that disconnects stops only its follower: the run goes on and can be
  re-attached to with ``GET /invocations/{id}/events`` (``Last-Event-ID``).  A request that
  asks ``on_disconnect=cancel`` cancels the invocation when its follower is cut off.
* **A live conversation belongs to its socket.**  ``WS /run_live`` opens a
  :class:`~trio_agents.TurnLoop` in the socket's handler: the loop, its turn and the turn's
  model stream are one tree under that handler.  The socket closing stops the loop (the live
  turn ends ``cancelled``); the conversation is journaled and resumes on the next socket.
* **The server owns nothing durable.**  Everything it answers comes from the runner or the
  store; a second server process on the same PostgreSQL answers the same.

What happens on cancel
----------------------
``POST ...:cancel`` records the cancel (here at once, in another process through the store,
which PostgreSQL pushes with LISTEN/NOTIFY), then follows the invocation until its ``ended``
event is stored, and only then answers, with that outcome.  It never answers "cancelled"
while work still runs.  A server shutting down (SIGTERM) stops accepting, cancels its
invocations and loops with reason ``shutdown`` (journaled, so another instance can resume
them) and returns once the runner has stored every ending.

What is persisted first
-----------------------
As in the runner: an invocation is durable (record, ``started``, the user's message) before
``/run`` or ``/run_sse`` sends anything; a decision or a cancel is in the store before the
endpoint answers; a live message is journaled before it can preempt the turn.
"""

from __future__ import annotations

from ._app import ServerState as ServerState
from ._auth import load_tokens as load_tokens
from ._create import create_app as create_app
from ._serve import serve as serve

__all__ = ["ServerState", "create_app", "load_tokens", "serve"]
