"""Shared fixtures.  Every test runs under pytest-trio (``trio_mode = true``)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import pytest

from trio_agents.stores import MemoryStore, PostgresStore, SQLiteStore, Store

# ==== stores: the PostgreSQL server and a fresh schema per test ================================
# Used by tests/test_stores.py and by any test that wants a real PostgreSQL.

POSTGRES_URL = os.environ.get(
    "TRIO_AGENTS_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL server at ``TRIO_AGENTS_POSTGRES_URL`` (checked once per session).

    Unreachable: the test is skipped with the reason - or fails when
    ``TRIO_AGENTS_REQUIRE_POSTGRES=1`` (CI sets it, so a missing server is never silent).
    """
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            pass
    except Exception as exc:
        message = (
            f"PostgreSQL is not reachable at {POSTGRES_URL} ({type(exc).__name__}: "
            f"{str(exc).strip()[:200]}); start it or point TRIO_AGENTS_POSTGRES_URL at one"
        )
        if os.environ.get("TRIO_AGENTS_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{message} (required: TRIO_AGENTS_REQUIRE_POSTGRES=1)")
        pytest.skip(message)
    return POSTGRES_URL


def _drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A schema name no other test uses; the schema (if created) is dropped afterwards."""
    schema = f"ta_test_{uuid.uuid4().hex[:16]}"
    yield schema
    _drop_schema(postgres_url, schema)


# ==== one store of each kind, for tests that run on all of them ============================


@attrs.define
class FakeClock:
    """The store's clock, moved by hand; ``read_at`` is ``time.monotonic()`` at its last reading."""

    now: float = 1_700_000_000.0
    read_at: float = 0.0

    def __call__(self) -> float:
        self.read_at = time.monotonic()
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@attrs.define
class StoreCase:
    """A store under test, its clock, and how to open another store on the same data."""

    kind: str
    store: Store
    clock: FakeClock
    twin: Callable[[], AbstractAsyncContextManager[Store]]
    postgres_url: str | None = None

    async def raw(self, *statements: str | tuple[str, Any]) -> list[tuple[Any, ...]]:
        """Raw SQL (``?`` placeholders) in one transaction, past every check of the store."""
        assert isinstance(self.store, (SQLiteStore, PostgresStore)), "SQL stores only"
        return await self.store._execute(*statements)


MEMORY = pytest.param("memory", id="memory")
SQLITE = pytest.param("sqlite", id="sqlite")
POSTGRES = pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)


def only(*kinds: Any) -> pytest.MarkDecorator:
    """Run a test on these stores only (``MEMORY``, ``SQLITE``, ``POSTGRES``)."""
    return pytest.mark.parametrize("store_kind", kinds, indirect=True)


@pytest.fixture(params=[MEMORY, SQLITE, POSTGRES])
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def postgres_target(store_kind: str, request: pytest.FixtureRequest) -> tuple[str, str] | None:
    """(url, fresh schema) for the PostgreSQL case: skips or fails if the server is away."""
    if store_kind != "postgres":
        return None
    url: str = request.getfixturevalue("postgres_url")
    schema: str = request.getfixturevalue("postgres_schema")
    return url, schema


@pytest.fixture
async def case(
    store_kind: str, postgres_target: tuple[str, str] | None, tmp_path: Path
) -> AsyncIterator[StoreCase]:
    clock = FakeClock()
    store: Store
    twin: Callable[[], AbstractAsyncContextManager[Store]]
    if store_kind == "memory":
        store = MemoryStore(clock=clock)

        @asynccontextmanager
        async def same_store() -> AsyncIterator[Store]:
            yield store

        twin = same_store
    elif store_kind == "sqlite":
        path = tmp_path / "stores" / "agents.db"
        store = SQLiteStore(path, clock=clock)
        twin = lambda: SQLiteStore(path, clock=clock)  # noqa: E731
    else:
        assert postgres_target is not None
        url, schema = postgres_target
        store = PostgresStore(url, schema=schema, clock=clock)
        twin = lambda: PostgresStore(url, schema=schema, clock=clock)  # noqa: E731
    async with cast(AbstractAsyncContextManager[Store], store):
        yield StoreCase(
            kind=store_kind,
            store=store,
            clock=clock,
            twin=twin,
            postgres_url=postgres_target[0] if postgres_target else None,
        )


# ==== end of the stores block =====================================================================


# ==== the browser: Debian's Chromium, for tests/test_ui_browser.py ===========================

CHROMIUM = os.environ.get("TRIO_AGENTS_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The Chromium the browser tests drive (``TRIO_AGENTS_CHROMIUM``, default Debian's).

    Absent: the test is skipped with the reason - or fails when
    ``TRIO_AGENTS_REQUIRE_BROWSER=1`` (CI sets it, so a missing browser is never silent).
    """
    if not os.access(CHROMIUM, os.X_OK):
        message = (
            f"no Chromium at {CHROMIUM}: apt-get install chromium (or point "
            "TRIO_AGENTS_CHROMIUM at one)"
        )
        if os.environ.get("TRIO_AGENTS_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{message} (required: TRIO_AGENTS_REQUIRE_BROWSER=1)")
        pytest.skip(message)
    return CHROMIUM
