"""One storage interface, two backends: the embedded SQLite file and shared PostgreSQL.

Invariant: the stores (approvals, approval uses, grants, pins, key ring, rate buckets) see only
``StateBackend``; each of their transactions is a synchronous function of one connection, written
once in the SQL both backends read, and run by ``read``/``write`` off the event loop. Every failure
of either backend is ``StateUnavailable``, so each store fails closed the same way on both.

``open_backend`` picks the backend from the configured location: a ``postgresql://`` (or
``postgres://``) URL is PostgreSQL, anything else a SQLite file path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from drawbridge.state.postgres import DEFAULT_POOL_SIZE, PostgresDB
from drawbridge.state.sqlite import StateDB

T = TypeVar("T")


class StateBackend(Protocol):
    """What the stores need of a state database (``StateDB`` and ``PostgresDB`` both are one)."""

    replica_id: str | None

    @property
    def kind(self) -> str: ...

    @property
    def shared(self) -> bool: ...

    @property
    def label(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def read_sync(self, fn: Callable[[Any], T], what: str) -> T: ...

    def write_sync(self, fn: Callable[[Any], T], what: str) -> T: ...

    async def read(self, fn: Callable[[Any], T], what: str) -> T: ...

    async def write(self, fn: Callable[[Any], T], what: str) -> T: ...

    def schema_version(self) -> int: ...

    def close(self) -> None: ...


def is_database_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def open_backend(
    location: str, *, pool_size: int = DEFAULT_POOL_SIZE, replica_id: str | None = None
) -> StateBackend:
    """The state at ``location`` (a PostgreSQL URL or a SQLite path), opened and migrated; blocking."""
    if is_database_url(location):
        return PostgresDB.open(location, pool_size=pool_size, replica_id=replica_id)
    db = StateDB.open(location)
    db.replica_id = replica_id
    return db


__all__ = ["StateBackend", "is_database_url", "open_backend"]
