"""Developer tasks: ``nox -s tests``, ``nox -s lint``, ``nox -s bench``, ``nox -s fuzz``,
``nox -s demo``."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


# Test workers (pytest-xdist): most tests wait on a subprocess, a server or a database, so two
# workers keep two cores busy.  ``nox -s tests -- -n 4`` overrides it; ``-n 0`` runs every test
# in one process.
TEST_WORKERS = "2"


def _chooses_workers(args: list[str]) -> bool:
    """Whether pytest's arguments already say how many workers (``-n N``, ``-nN``,
    ``--numprocesses[=]N``)."""
    return any(arg.startswith(("-n", "--numprocesses")) for arg in args)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, on ``TEST_WORKERS`` worker processes (PostgreSQL tests skip if the
    server is absent, unless CI requires it)."""
    session.install("-e", ".[dev]")
    args = list(session.posargs)
    workers = [] if _chooses_workers(args) else ["-n", TEST_WORKERS]
    session.run("pytest", *workers, *args)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (with the ASYNC rules) and mypy --strict."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Speed and memory benchmarks; prints the figures the README quotes (``-- --quick``: a
    smoke run of each)."""
    session.install("-e", ".[dev]")
    for script in (
        "cancel_latency",
        "overhead",
        "memory",
        "journal",
        "flat_costs",
        "turnloop",
        "parked",
        "feed",
        "server",
        "batch",
        "fleet",
        "pg_calls",
        "otel",
        "streams",
        "mcp",
        "agui",
        "a2a",
        "live",
    ):
        session.run("python", "-m", f"benchmarks.{script}", *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The randomized cancel, turn-loop, batch, gate-closer, mass-cancel, PostgreSQL lock-order,
    changes-feed, fleet (processes killed at random) and journal-writer tests at nightly size:
    thousands of scenarios (the suite runs a couple of hundred), 1,000 parked invocations
    cancelled on PostgreSQL, a hundred fleets on each store.  ``-- -x`` stops at the first
    failure, which names its seed."""
    session.install("-e", ".[dev]")
    session.run(
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/test_cancel_fuzz.py",
        "tests/test_turnloop_fuzz.py",
        "tests/test_batch_fuzz.py",
        "tests/test_gate_closer.py",
        "tests/test_cancel_waves.py",
        "tests/test_store_lock_order.py",
        "tests/test_changes_feed.py",
        "tests/test_fleet.py",
        "tests/test_writer_fuzz.py",
        *session.posargs,
        env={
            "TRIO_AGENTS_FUZZ": "5000",
            "TRIO_AGENTS_FUZZ_SQLITE": "1000",
            "TRIO_AGENTS_FUZZ_FLEET": "100",
        },
    )


@nox.session
def demo(session: nox.Session) -> None:
    """The offline demo: a fake model server on 127.0.0.1, a real agent, a real cancel."""
    session.install("-e", ".")
    session.run("trio-agents", "demo")
