"""Serve an app on Hypercorn's trio worker, with a shutdown that journals every ending."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Final, cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework
from starlette.applications import Starlette

from .._exceptions import UsageError
from ._app import ServerState

__all__ = ["LOOPBACK", "WEBSOCKET_READ_FACTOR", "serve"]

logger = logging.getLogger("trio_agents.server")

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
WEBSOCKET_READ_FACTOR: Final = 4
"""Hypercorn reads a WebSocket message of up to this many times ``max_body`` (at least its
own default, 16 MiB) before it closes the socket itself."""


async def _signalled() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logger.info("received %s: shutting down", signal.Signals(signum).name)
            return


async def serve(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    graceful_timeout: float = 10.0,
    backlog: int = 1024,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` (from :func:`create_app`) until ``shutdown_trigger`` returns (default:
    SIGTERM or SIGINT), reporting the bound URLs (``["http://127.0.0.1:8000"]``) through
    ``task_status``; ``port=0`` takes a free port.

    Shutting down stops accepting, cancels every invocation and live conversation this app
    runs with reason ``shutdown`` (the runner journals each ending, so another instance can
    resume them), and gives open requests ``graceful_timeout`` seconds to send their terminal
    frames before they are cut.  ``backlog`` is the listening socket's queue of connections
    not yet accepted.  A ``/run_live`` message above the app's ``max_body`` is refused by
    the app (1009, with the reason); one above :data:`WEBSOCKET_READ_FACTOR` times it (and
    above 16 MiB) is not even read whole: Hypercorn closes the socket (1009, no reason).  The
    runner stays open: leave its block after this returns.

    Raises :class:`~trio_agents.UsageError` for an app that serves without tokens
    (``insecure_dev``) on anything but the loopback interface.
    """
    state: ServerState = app.state.trio_agents
    if state.auth.insecure_dev and host not in LOOPBACK:
        raise UsageError(f"insecure_dev serves on 127.0.0.1 only, not on {host!r}")
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = graceful_timeout
    # Hypercorn's default of 100 resets connections when hundreds of clients connect at once
    # (a deploy, a reconnect storm).
    config.backlog = backlog
    config.accesslog = None
    config.keep_alive_timeout = 30
    # The one limit on a /run_live message is the app's own, max_body (1009 with the reason,
    # nothing journaled: see ._live).  Hypercorn reads a message whole before the app sees
    # it and has a limit of its own (16 MiB by default), kept above the app's as the bound on
    # what one socket can make the server hold - never at it: past it Hypercorn 0.18 closes
    # with 1009 without a reason and stops reading the socket's events, so the client's close
    # is never read and the conversation stays open until the client drops the connection.
    config.websocket_max_message_size = max(
        config.websocket_max_message_size, WEBSOCKET_READ_FACTOR * state.max_body
    )

    async def shutdown() -> None:
        await (shutdown_trigger or _signalled)()
        state.begin_shutdown()

    # Starlette's ASGI signature is looser than Hypercorn's typed one; it is the same protocol.
    await hypercorn_serve(
        cast(ASGIFramework, app), config, shutdown_trigger=shutdown, task_status=task_status
    )
