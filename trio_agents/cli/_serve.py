"""``trio-agents serve module:agent [...]``: the server, with its runner and store."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from functools import partial
from typing import Annotated

import trio
import typer
from rich.console import Console

from .._collector import tune_collector
from .._exceptions import UsageError
from .._recovery import Recover
from ..agents import AgentLike
from ..runner import Runner
from ..server import create_app, load_tokens, serve
from ..server._serve import LOOPBACK
from ._common import (
    DEFAULT_STORE,
    RecoverChoice,
    RecoverOption,
    StoreOption,
    console,
    execute,
    load_agent,
)

__all__ = ["register", "serve_agents"]


async def serve_agents(
    console: Console,
    agents: Sequence[AgentLike],
    *,
    store: str,
    host: str,
    port: int,
    tokens: dict[str, str],
    insecure_dev: bool,
    cors_origins: Sequence[str] = (),
    max_active_per_user: int = 8,
    lease_ttl: float = 30.0,
    ui: bool = True,
    recover: Recover = "resume",
    otel: bool = False,
    mcp: bool = False,
) -> None:
    """Serve ``agents`` (and, with ``ui``, the dev UI at ``/``) until SIGTERM or Ctrl-C.

    The runner (and its store) is opened first and closed last: a shutdown stops accepting,
    cancels what runs here with reason ``shutdown``, and the runner stores every ending before
    the command exits.  With ``recover`` (default ``"resume"``) it takes over the invocations
    and turn loops of its agents whose process died (see :mod:`trio_agents._recovery`).
    With ``otel``, invocations are traced and measured (:mod:`trio_agents.otel`), exported as
    the ``OTEL_*`` variables say; what is buffered is flushed at exit.
    """
    hooks: list[object] = []
    telemetry = None
    if otel:
        from .. import otel as ta_otel

        telemetry = ta_otel.configure(service_name="trio-agents")
        hooks.append(ta_otel.OTelHooks())
    try:
        await _serve(
            console,
            agents,
            Runner(store, agents=agents, lease_ttl=lease_ttl, recover=recover, hooks=hooks),
            store=store,
            host=host,
            port=port,
            tokens=tokens,
            insecure_dev=insecure_dev,
            cors_origins=cors_origins,
            max_active_per_user=max_active_per_user,
            ui=ui,
            recover=recover,
            mcp=mcp,
        )
    finally:
        if telemetry is not None:
            telemetry.shutdown()


async def _serve(
    console: Console,
    agents: Sequence[AgentLike],
    opening: Runner,
    *,
    store: str,
    host: str,
    port: int,
    tokens: dict[str, str],
    insecure_dev: bool,
    cors_origins: Sequence[str],
    max_active_per_user: int,
    ui: bool,
    recover: Recover,
    mcp: bool = False,
) -> None:
    async with opening as runner:
        app = create_app(
            agents,
            runner=runner,
            tokens=tokens,
            insecure_dev=insecure_dev,
            cors_origins=cors_origins,
            max_active_per_user=max_active_per_user,
            ui=ui,
            mcp=mcp,
        )
        async with trio.open_nursery() as nursery:
            urls: list[str] = await nursery.start(partial(serve, app, host=host, port=port))
            tune_collector()
            url = urls[0]
            names = ", ".join(sorted(a.name for a in agents))
            console.print(
                f"serving {names} at {url}  (store {store}; orphans: {recover})", markup=False
            )
            if ui:
                console.print(f"dev UI: {url}/ui/", markup=False)
            if tokens:
                token, user = next(iter(tokens.items()))
                users = ", ".join(sorted(set(tokens.values())))
                console.print(f"token for user {user}: {token}  (users: {users})", markup=False)
                console.print(
                    f'try: curl -H "Authorization: Bearer {token}" {url}/list-apps', markup=False
                )
            else:
                console.print(
                    "insecure dev mode: no token needed; every request is the user it names",
                    markup=False,
                )
            sys.stdout.flush()
    console.print("stopped; every invocation's ending is stored", markup=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        agents: Annotated[
            list[str] | None,
            typer.Argument(metavar="AGENTS", help="module:attribute of each Agent (or workflow)"),
        ] = None,
        store: StoreOption = DEFAULT_STORE,
        host: Annotated[
            str, typer.Option(metavar="HOST", help="address to listen on")
        ] = "127.0.0.1",
        port: Annotated[
            int, typer.Option(min=0, max=65535, metavar="PORT", help="0 takes a free port")
        ] = 8000,
        tokens: Annotated[
            str | None,
            typer.Option(
                metavar="FILE",
                help="bearer tokens: JSON {token: user} or lines 'token user' "
                "(default: $TRIO_AGENTS_TOKENS, 'token=user,...')",
            ),
        ] = None,
        insecure_dev: Annotated[
            bool,
            typer.Option(
                "--insecure-dev",
                help="serve without tokens, on 127.0.0.1 only (every request is the user it names)",
            ),
        ] = False,
        cors_origin: Annotated[
            list[str] | None, typer.Option(metavar="ORIGIN", help="allow this origin (repeatable)")
        ] = None,
        max_active_per_user: Annotated[
            int, typer.Option(min=1, metavar="N", help="invocations one user may run at once")
        ] = 8,
        lease_ttl: Annotated[
            float,
            typer.Option(
                min=1.0,
                metavar="SECONDS",
                help="seconds an invocation's lease lasts: how soon another instance may "
                "resume the invocations of one that died",
            ),
        ] = 30.0,
        no_ui: Annotated[
            bool,
            typer.Option(
                "--no-ui", help="leave out the dev UI (served at / otherwise: chat, stop, approve)"
            ),
        ] = False,
        recover: RecoverOption = RecoverChoice.resume,
        demo: Annotated[
            bool,
            typer.Option(
                "--demo",
                help="serve the offline demo agent (a fake model on 127.0.0.1, no API key; "
                "without tokens it serves as --insecure-dev)",
            ),
        ] = False,
        otel: Annotated[
            bool,
            typer.Option(
                "--otel",
                help="trace and measure with OpenTelemetry, exported as the standard OTEL_* "
                "variables say (needs trio-agents[otel])",
            ),
        ] = False,
        mcp: Annotated[
            bool,
            typer.Option("--mcp", help="serve the agents as MCP tools at /mcp (streamable HTTP)"),
        ] = False,
    ) -> None:
        """Serve agents over HTTP, SSE and WebSocket, with the dev UI at /, until SIGTERM or
        Ctrl-C.  Try it offline with `trio-agents serve --demo`."""

        async def main() -> int:
            if demo and agents:
                raise UsageError("give the agents to serve or --demo, not both")
            if not demo and not agents:
                raise UsageError(
                    "name the agents to serve (module:attribute), or try the offline demo: "
                    "trio-agents serve --demo"
                )
            found = load_tokens(tokens)
            dev = insecure_dev or (demo and not found)
            if not found and not dev:
                raise UsageError(
                    "no bearer tokens: give --tokens FILE or set $TRIO_AGENTS_TOKENS "
                    "('token=user,...'), or serve on 127.0.0.1 without them with --insecure-dev"
                )
            if dev and host not in LOOPBACK:
                flag = "--insecure-dev" if insecure_dev else "--demo without tokens"
                raise UsageError(f"{flag} serves on 127.0.0.1 only, not on {host!r}")
            async with contextlib.AsyncExitStack() as stack:
                if demo:
                    from .._demo import open_demo_agent

                    loaded: list[AgentLike] = [await stack.enter_async_context(open_demo_agent())]
                else:
                    loaded = [load_agent(spec) for spec in agents or ()]
                await serve_agents(
                    console(),
                    loaded,
                    store=store,
                    host=host,
                    port=port,
                    tokens=found,
                    insecure_dev=dev,
                    cors_origins=cors_origin or [],
                    max_active_per_user=max_active_per_user,
                    lease_ttl=lease_ttl,
                    recover=recover.value,
                    ui=not no_ui,
                    otel=otel,
                    mcp=mcp,
                )
            return 0

        execute(main)
