"""Shared fixtures.  Every test runs under pytest-trio (``trio_mode = true``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

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


# ==== end of the stores block =====================================================================
