"""What every command shares: loading an agent, checking its models' settings, the store
option, running a command under trio and turning errors into one line and an exit status."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import trio
import typer
from rich.console import Console
from rich.markup import escape

from .._exceptions import (
    AuthenticationError,
    ModelConnectionError,
    ModelTimeoutError,
    NotFoundError,
    TrioAgentsError,
    UsageError,
)
from ..agents import AgentLike
from ..agents._models import models_of
from ..events import ErrorInfo
from ..models._model import HTTPModel
from ..runner import Outcome

__all__ = [
    "DEFAULT_STORE",
    "Exit",
    "RecoverChoice",
    "RecoverOption",
    "StoreOption",
    "check_models",
    "console",
    "error_console",
    "execute",
    "exit_status",
    "fail",
    "failure_hint",
    "load_agent",
    "open_models",
    "set_debug",
]

DEFAULT_STORE = "sqlite:///.trio_agents/agents.db"

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="TRIO_AGENTS_STORE",
        metavar="URL",
        help="Where invocations are journaled: sqlite:///PATH, postgresql://... or memory://",
    ),
]


class RecoverChoice(StrEnum):
    """``--recover``: what a serving process does with the orphans of its agents (see
    :mod:`trio_agents._recovery`)."""

    resume = "resume"
    fail = "fail"
    off = "off"


RecoverOption = Annotated[
    RecoverChoice,
    typer.Option(
        help="invocations of these agents whose process died (lease lapsed): resume them "
        "here, end them failed, or leave them",
    ),
]


class Exit(IntEnum):
    """The command's exit statuses."""

    COMPLETED = 0
    FAILED = 1  # the invocation failed, or an unexpected error
    USAGE = 2  # bad input: nothing was run
    PAUSED = 3  # waiting for a decision: `trio-agents decide`, then `resume`
    BUSY = 75  # another run writes the batch's outcomes file: nothing was run (EX_TEMPFAIL)
    INTERRUPTED = 130  # Ctrl-C


def exit_status(outcome: Outcome, *, interrupted: bool = False) -> Exit:
    if outcome.status == "completed":
        return Exit.COMPLETED
    if outcome.status == "paused":
        return Exit.PAUSED
    if outcome.status == "cancelled":
        return Exit.INTERRUPTED if interrupted else Exit.FAILED
    return Exit.FAILED


def console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def error_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


# ---- agents and their models -----------------------------------------------------------------


def load_agent(spec: str) -> AgentLike:
    """The agent named by ``module:attribute``, imported from the working directory first."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected module:agent (e.g. examples.weather:agent), got {spec!r}")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UsageError(
                f"cannot import module {module_name!r}: no such module (run from the "
                "directory that holds it, or set PYTHONPATH)"
            ) from exc
        raise UsageError(f"cannot import module {module_name!r}: {exc}") from exc
    except TrioAgentsError as exc:  # e.g. a model built with a bad base_url at import time
        raise UsageError(f"cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:
        raise UsageError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if _is_agent(v))
        known = f" (it has: {', '.join(names)})" if names else ""
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}{known}")
    agent = getattr(module, attr)
    if not _is_agent(agent):
        raise UsageError(
            f"{spec} is a {type(agent).__name__}, not an agent: expected a ta.Agent or a "
            "workflow (something with a name and a run method)"
        )
    return agent  # type: ignore[no-any-return]


def _is_agent(value: object) -> bool:
    return isinstance(getattr(value, "name", None), str) and callable(getattr(value, "run", None))


# The vendors' own endpoints need a key; a local server (vLLM, Ollama, a proxy) may not.
_KEYED_HOSTS = {"api.openai.com": "OPENAI", "api.anthropic.com": "ANTHROPIC"}


def check_models(agent: AgentLike) -> None:
    """Refuse, before any connection, a model that cannot work: a vendor's endpoint with no
    API key.  (A bad base URL is refused when the model is made.)"""
    for model in models_of(agent):
        if not isinstance(model, HTTPModel):
            continue
        provider = model.http_provider
        host = urllib.parse.urlsplit(provider.base_url).hostname or ""
        vendor = _KEYED_HOSTS.get(host)
        if vendor is not None and not provider.api_key:
            raise UsageError(
                f"{vendor}_API_KEY is not set: the model {model.name!r} of {agent.name!r} "
                f"calls {provider.base_url}, which needs a key. Export {vendor}_API_KEY=..., "
                f"or point {vendor}_BASE_URL at a server that needs none"
            )


@contextlib.asynccontextmanager
async def open_models(agent: AgentLike) -> AsyncIterator[None]:
    """The command owns the agent's models for its run: it opens them around the runner, and
    leaving closes their HTTP clients (shielded, so Ctrl-C still closes them)."""
    async with contextlib.AsyncExitStack() as stack:
        for model in models_of(agent):
            await stack.enter_async_context(model)
        yield


def failure_hint(outcome: Outcome, agent: AgentLike | None = None) -> str | None:
    """What to do about a failed outcome, when its error says."""
    error = outcome.error
    if not isinstance(error, ErrorInfo):
        return None
    urls = sorted(
        {m.http_provider.base_url for m in models_of(agent) if isinstance(m, HTTPModel)}
        if agent is not None
        else set()
    )
    where = f" at {', '.join(urls)}" if urls else ""
    if error.type in (ModelConnectionError.__name__, ModelTimeoutError.__name__):
        return f"is the model server{where} running? (OPENAI_BASE_URL / ANTHROPIC_BASE_URL)"
    if error.type == AuthenticationError.__name__:
        return "the model server refused the API key: check OPENAI_API_KEY / ANTHROPIC_API_KEY"
    if error.type == NotFoundError.__name__:
        return f"the model server{where} does not know this model or path: check the name"
    return None


# ---- running a command -----------------------------------------------------------------------

_debug = False


def set_debug(on: bool) -> None:
    global _debug
    _debug = on or bool(os.environ.get("TRIO_AGENTS_DEBUG"))


def execute(fn: Callable[..., Awaitable[int]], *args: Any) -> NoReturn:
    """``trio.run(fn, *args)``, exiting with the status it returns; a library error becomes
    one line on stderr and status 2, any other exception one line and status 1 (the
    traceback with ``--debug``)."""
    raise typer.Exit(_status_of(fn, *args))


def _status_of(fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    try:
        return int(trio.run(fn, *args))
    except BaseException as exc:  # outside trio.run: no trio.Cancelled reaches here
        if _debug:
            raise
        leaves = list(_leaves(exc))
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            return Exit.INTERRUPTED
        if not all(isinstance(e, Exception) for e in leaves):
            raise  # SystemExit and the like
        for error in leaves:
            if isinstance(error, TrioAgentsError):
                fail(str(error))
            else:
                fail(f"{_describe(error)} (run again with --debug for the traceback)")
        if all(isinstance(e, TrioAgentsError) for e in leaves):
            return Exit.USAGE
        return Exit.FAILED


def fail(message: str) -> None:
    error_console().print(f"[red]error:[/] {escape(message)}")


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The errors ``exc`` is made of (a task group's, unwrapped)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc
