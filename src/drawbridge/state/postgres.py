"""The shared state on PostgreSQL: what several gateway replicas hold in common.

Invariant: ``PostgresDB`` keeps every promise of ``drawbridge.state.sqlite.StateDB`` -- one
transaction per ``read``/``write``, every failure (cannot connect, connection lost, pool
exhausted, server restarted) surfaced as ``StateUnavailable`` naming the database (never its
password, in the userinfo or in any query parameter: ``redacted`` masks both, ``scrubbed`` masks them
in the driver's own words) and the operation, with a ``detail`` that names neither for what an agent
reads, a schema newer than this code refused -- and adds one: write
transactions are serialised across every replica by a transaction-level advisory lock, so
"check the row, then change it" is atomic against the other replicas exactly as ``BEGIN
IMMEDIATE`` makes it atomic against other processes on one SQLite file. Of two replicas
resolving one approval, or consuming one approval use, one wins and the other reads the result.

Theory of operation.

* Connections. A ``psycopg_pool.ConnectionPool`` of at most ``pool_size`` connections, each
  checked on checkout (a connection the server dropped, say by a restart, is replaced rather than
  handed out); a checkout waits at most ``timeout`` seconds. The stores' transactions are
  synchronous functions of one connection, run in a worker thread (``anyio.to_thread``) as on
  SQLite, so one store's SQL serves both backends: ``_PgConnection`` turns SQLite's ``?``
  placeholders into psycopg's, ``INSERT OR IGNORE`` into ``ON CONFLICT DO NOTHING``, and a
  duplicate key on a plain ``INSERT`` into ``sqlite3.IntegrityError`` after rolling back to a
  savepoint (the stores draw a new id and go on, as on SQLite).
* Reconnecting. Nothing is held across a failure: the pool drops a broken connection, the next
  transaction gets a fresh one, and the calls in between were refused. The pool's own reconnection
  attempts back off exponentially (1 s, 2 s, 4 s, ...) for as long as ``reconnect_timeout``: left at
  its default (5 minutes) a replica whose database was down for 15 s would wait another 16 s before
  trying again, not ready all the while. ``RECONNECT_SECONDS`` ends each run of attempts after 5 s
  (at most 2 s apart); the next checkout starts a new run at once, so a replica connects again within
  a few seconds of the database's return, as the pin check's retries (at most 5 s apart) expect. The listener
  (``listen``) reconnects with a bounded backoff and, after each reconnection, reports a resync
  (``None``), because notifications sent while it was away are lost.
* The driver's log. psycopg's own loggers go through ``_DriverLog``: one line per message, the
  password masked, written by the gateway's handlers (so ``--log-format json`` holds for them too).
* The replica's id. ``claim`` holds a session advisory lock keyed by the replica's id on a connection
  of its own for the life of the process, so a second process started under a running replica's id is
  refused (``ReplicaIdInUse``) before it could end that replica's approvals as its own.
* Schema. ``schema_version`` as on SQLite, migrated under the same advisory lock, so replicas
  starting together migrate once. A database newer than ``SCHEMA_VERSION`` is refused.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import sqlite3
from urllib.parse import unquote
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from drawbridge.state.postgres_schema import MIGRATIONS
from drawbridge.state.sqlite import StateUnavailable, apply_migrations

# The driver (the ``postgresql`` extra), imported by ``PostgresDB.open``: a gateway on its SQLite file
# never loads it (a quarter of a second and several MiB at every start). Every other use follows an open.
psycopg: Any = None
psycopg_pool: Any = None
pg_errors: Any = None


def _load_driver() -> bool:
    global psycopg, psycopg_pool, pg_errors
    if psycopg is None:
        try:
            import psycopg as driver
            import psycopg_pool as pool
            from psycopg import errors
        except ImportError:  # pragma: no cover - reported by ``PostgresDB.open``
            return False
        psycopg, psycopg_pool, pg_errors = driver, pool, errors
    return True

T = TypeVar("T")
logger = logging.getLogger("drawbridge.state")

LOCK_KEY: Final = 0x64726272
"""The advisory lock every write transaction takes ("drbr")."""
DEFAULT_POOL_SIZE: Final = 10
DEFAULT_TIMEOUT: Final = 3.0
LISTEN_BACKOFF_MAX: Final = 2.0
RECONNECT_SECONDS: Final = 5.0
"""How long one run of the pool's reconnection attempts lasts (module docstring, Reconnecting)."""
_PLACEHOLDER: Final = re.compile(r"\?")
_OR_IGNORE: Final = re.compile(r"^\s*INSERT OR IGNORE INTO", re.IGNORECASE)
_SECRET_NAMES: Final = ("pass", "key", "secret", "token")
_PLAIN_INSERT: Final = re.compile(r"^\s*INSERT INTO(?!.*\bON CONFLICT\b)", re.IGNORECASE | re.DOTALL)


def _split(url: str) -> tuple[str, str, str, str]:
    """``scheme://``, the userinfo (without ``@``; empty when none), the host and path, and the query
    (from ``?``), cut as libpq cuts a URI: the userinfo ends at the first ``@`` before any ``/``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", "", url  # not a URL: all of it is treated as secret
    head = rest.split("/", 1)[0]
    userinfo = ""
    if "@" in head:
        userinfo, rest = rest.split("@", 1)
    location, query_sep, query = rest.partition("?")
    return scheme + sep, userinfo, location, query_sep + query


def _secret_values(url: str) -> list[str]:
    """Every part of ``url`` that may be a password: the userinfo after its user name and every query
    value (``password``, ``passfile``, ``sslpassword``, ...), raw and percent-decoded."""
    _, userinfo, _, query = _split(url)
    found = [userinfo.split(":", 1)[1]] if ":" in userinfo else []
    for name, _, value in (item.partition("=") for item in query.lstrip("?").split("&")):
        if value and (len(value) >= 8 or any(word in name.lower() for word in _SECRET_NAMES)):
            found.append(value)  # a short value of an ordinary option (sslmode=require) is no secret
    if not url.partition("://")[1]:
        found.append(url)
    decoded = [unquote(value) for value in found]
    return sorted({v for v in found + decoded if v}, key=len, reverse=True)


def redacted(url: str) -> str:
    """The URL without a password in any form, for every message that names the database: the
    userinfo keeps its user name only, and every query value is masked (libpq reads ``password``,
    ``passfile``, ``sslpassword`` and more from there; masking all of them leaves nothing to miss)."""
    scheme, userinfo, location, query = _split(url)
    if not scheme:
        return "the configured database URL"
    user = userinfo.split(":", 1)[0].split("?", 1)[0]
    shown = scheme + (f"{user}:***@" if user != userinfo else f"{user}@" if userinfo else "") + location
    if query:
        shown += "?" + "&".join(
            f"{name}=***" if sep else name for name, sep, _ in (item.partition("=") for item in query[1:].split("&"))
        )
    return shown


def scrubbed(url: str, text: str) -> str:
    """``text`` with every secret part of ``url`` masked: a driver's message may quote the connection
    string it could not parse."""
    for value in _secret_values(url):
        text = text.replace(value, "***")
    return text


class _DriverLog(logging.Handler):
    """psycopg's own log lines (the pool's "error connecting ..."), written as the gateway's: folded onto
    one line (the server's hint follows on a second), every open database's password masked, and
    handed to ``drawbridge.state.driver``, whose handlers write them in the chosen ``--log-format``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.urls: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split())
            for url in list(self.urls):
                text = scrubbed(url, text)
        except Exception:  # noqa: BLE001 -- a message that cannot be built is reported by its type
            text = f"a driver log line could not be formatted ({record.levelname})"
        record.msg, record.args, record.exc_info, record.exc_text, record.stack_info = text, None, None, None, None
        logging.getLogger("drawbridge.state.driver").handle(record)


_DRIVER_LOG: Final = _DriverLog()


def _route_driver_log(url: str) -> None:
    """Send psycopg's loggers through ``_DriverLog`` (once), masking ``url``'s password from now on."""
    _DRIVER_LOG.urls.add(url)
    driver_log = logging.getLogger("psycopg")
    if _DRIVER_LOG not in driver_log.handlers:
        driver_log.addHandler(_DRIVER_LOG)
        driver_log.propagate = False  # never Python's last-resort handler, which writes them raw
        if driver_log.level == logging.NOTSET:
            driver_log.setLevel(logging.WARNING)


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """SQLite's dialect of the stores' SQL, as PostgreSQL reads it (module docstring)."""
    text = sql.replace("%", "%%")
    if _OR_IGNORE.match(text):
        text = _OR_IGNORE.sub("INSERT INTO", text, count=1) + " ON CONFLICT DO NOTHING"
    return _PLACEHOLDER.sub("%s", text)


class _PgConnection:
    """The part of ``sqlite3.Connection`` the stores use, on a psycopg connection in a transaction."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        text = translate(sql)
        if _PLAIN_INSERT.match(sql):
            try:
                with self._conn.transaction():
                    return self._conn.execute(text, tuple(params))
            except pg_errors.UniqueViolation as exc:
                raise sqlite3.IntegrityError(str(exc.diag.constraint_name or "unique")) from None
        return self._conn.execute(text, tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        cursor = self._conn.cursor()
        cursor.executemany(translate(sql), [tuple(r) for r in rows])
        return cursor


class PostgresDB:
    """The open shared database. Build with ``PostgresDB.open`` (blocking, at startup)."""

    kind: Final = "postgresql"
    shared: Final = True

    def __init__(self, url: str, pool: Any, *, replica_id: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._url = url
        self._pool = pool
        self._closed = False
        self._timeout = timeout
        self._lease: Any = None
        self.replica_id = replica_id

    @classmethod
    def open(
        cls,
        url: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        timeout: float = DEFAULT_TIMEOUT,
        replica_id: str | None = None,
    ) -> PostgresDB:
        """Connect, migrate, and return the database; ``StateUnavailable`` says why not."""
        if not _load_driver():
            raise StateUnavailable(
                "state on PostgreSQL needs the postgresql extra: pip install 'drawbridge[postgresql]'"
            )
        _route_driver_log(url)
        pool = psycopg_pool.ConnectionPool(
            url, min_size=1, max_size=max(1, pool_size), timeout=timeout, open=False,
            check=psycopg_pool.ConnectionPool.check_connection, name="drawbridge-state",
            reconnect_timeout=RECONNECT_SECONDS,
            kwargs={"connect_timeout": max(1, int(timeout))},
        )
        pool_log = logging.getLogger("psycopg.pool")
        level = pool_log.level
        try:
            with psycopg.connect(url, connect_timeout=max(1, int(timeout))):
                pass  # the server's own reason when it cannot be reached, rather than the pool's timeout
            pool_log.setLevel(logging.CRITICAL)  # the reason is ours to say, in one line
            pool.open(wait=True, timeout=timeout)
        except (psycopg_pool.PoolTimeout, psycopg.Error) as exc:
            pool.close()
            raise StateUnavailable(
                f"cannot connect to the state database {redacted(url)}: {scrubbed(url, _describe(exc))}"
            ) from None
        finally:
            pool_log.setLevel(level)
        db = cls(url, pool, replica_id=replica_id, timeout=timeout)
        try:
            db.write_sync(_migrate, "migrate")
        except BaseException:
            db.close()
            raise
        return db

    # -- properties ----------------------------------------------------------------------------

    @property
    def label(self) -> str:
        return redacted(self._url)

    @property
    def closed(self) -> bool:
        return self._closed

    def _describe(self, exc: BaseException) -> str:
        return scrubbed(self._url, _describe(exc))

    # -- transactions --------------------------------------------------------------------------

    def _run(self, fn: Callable[[Any], T], what: str, *, write: bool) -> T:
        if self._closed:
            raise StateUnavailable(f"state database {self.label} is closed ({what})", detail=f"{what}: closed")
        try:
            with self._pool.connection() as conn, conn.transaction():
                if write:
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                return fn(_PgConnection(conn))
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise StateUnavailable(
                f"state database {self.label}: {what}: {self._describe(exc)}",
                detail=f"{what}: {_kind_of_failure(exc)}",
            ) from None

    def read_sync(self, fn: Callable[[Any], T], what: str) -> T:
        return self._run(fn, what, write=False)

    def write_sync(self, fn: Callable[[Any], T], what: str) -> T:
        return self._run(fn, what, write=True)

    async def read(self, fn: Callable[[Any], T], what: str) -> T:
        return await anyio.to_thread.run_sync(functools.partial(self._run, fn, what, write=False))

    async def write(self, fn: Callable[[Any], T], what: str) -> T:
        return await anyio.to_thread.run_sync(functools.partial(self._run, fn, what, write=True))

    async def transact(self, fn: Callable[[Any], T], what: str) -> T:
        """A write transaction without the replicas' lock: for rows the caller locks itself
        (``SELECT ... FOR UPDATE``), so that writers of other rows do not wait for it."""
        return await anyio.to_thread.run_sync(functools.partial(self._run, fn, what, write=False))

    def ping_sync(self, timeout: float) -> None:
        """One round trip to the server, waiting at most ``timeout`` for a connection; raises
        ``StateUnavailable`` (``/readyz`` asks this when every call needs the state)."""
        if self._closed:
            raise StateUnavailable(f"state database {self.label} is closed (ping)", detail="ping: closed")
        try:
            with self._pool.connection(timeout=timeout) as conn:
                conn.execute("SELECT 1")
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise StateUnavailable(
                f"state database {self.label}: ping: {self._describe(exc)}", detail=f"ping: {_kind_of_failure(exc)}"
            ) from None

    def schema_version(self) -> int:
        return self.read_sync(
            lambda c: int(c.execute("SELECT max(version) FROM schema_version").fetchone()[0]),
            "read schema version",
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()
            if self._lease is not None:
                self._lease.close()  # the replica id is free again

    # -- the replica's name ----------------------------------------------------------------------

    def claim(self, replica_id: str) -> None:
        """Hold ``replica_id`` for as long as this process runs: a session advisory lock on a connection
        of its own, which the server drops with the connection (the process ended, or died: the server's
        keepalive probes notice a vanished host within a minute). ``ReplicaIdInUse`` when a running
        replica holds it: a second process under the same id would end the first one's approvals as
        "of a previous run" and resolve them as its own."""
        key = int.from_bytes(hashlib.sha256(f"drawbridge replica {replica_id}".encode()).digest()[:8], "big", signed=True)
        try:
            conn = psycopg.connect(self._url, autocommit=True, connect_timeout=max(1, int(self._timeout)))
        except psycopg.Error as exc:
            raise StateUnavailable(f"cannot connect to the state database {self.label}: {self._describe(exc)}") from None
        try:
            for setting, value in (("idle", 10), ("interval", 5), ("count", 3)):
                conn.execute(f"SET tcp_keepalives_{setting} = {value}")  # noqa: S608 -- constants
            held = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]
        except psycopg.Error as exc:
            conn.close()
            raise StateUnavailable(f"state database {self.label}: claim replica id: {self._describe(exc)}") from None
        if not held:
            conn.close()
            raise ReplicaIdInUse(
                f"replica.id {replica_id!r} is in use by a running replica on {self.label}; give each replica "
                "an id of its own (or stop the other first)"
            )
        self._lease = conn

    def _reclaim(self) -> None:
        """After the server came back (a restart drops every session lock): hold the id again."""
        lease = self._lease
        if lease is None or self.replica_id is None:
            return
        try:
            lease.execute("SELECT 1")
            return  # the session, and so its lock, outlived the interruption
        except psycopg.Error:
            lease.close()
        self._lease = None
        try:
            self.claim(self.replica_id)
        except StateUnavailable as exc:
            logger.error("%s", exc)

    # -- notifications -------------------------------------------------------------------------

    async def listen(
        self,
        channels: Sequence[str],
        on_event: Callable[[str, str | None], Awaitable[None]],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Deliver every notification on ``channels`` to ``on_event(channel, payload)``, forever;
        after a reconnection, ``on_event(channel, None)`` for each channel (a resync)."""
        started, backoff = False, 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
            except psycopg.Error as exc:
                if not started:
                    raise StateUnavailable(f"cannot listen on {self.label}: {self._describe(exc)}") from None
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, LISTEN_BACKOFF_MAX)
                continue
            try:
                async with conn:
                    for channel in channels:
                        await conn.execute(f'LISTEN "{channel}"')
                    if started:
                        logger.warning("state notifications resumed from %s", self.label)
                        await anyio.to_thread.run_sync(self._reclaim)
                        for channel in channels:
                            await on_event(channel, None)
                    else:
                        started = True
                        task_status.started()
                    backoff = 0.1
                    async for note in conn.notifies():
                        await on_event(note.channel, note.payload)
            except psycopg.Error as exc:
                logger.warning("state notifications from %s interrupted (%s)", self.label, self._describe(exc))
                await anyio.sleep(backoff)


class ReplicaIdInUse(StateUnavailable):
    """Another running replica holds this replica's id (``PostgresDB.claim``)."""


def _kind_of_failure(exc: BaseException) -> str:
    """What failed, without the server's words (which name its host and port)."""
    if isinstance(exc, (psycopg_pool.PoolTimeout, psycopg.OperationalError)):
        return f"the database could not be reached ({type(exc).__name__})"
    return f"the database refused the transaction ({type(exc).__name__})"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text and text[0] else type(exc).__name__


def _migrate(conn: _PgConnection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version ("
        "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    apply_migrations(conn, MIGRATIONS, "the state database")


__all__ = ["DEFAULT_POOL_SIZE", "LOCK_KEY", "RECONNECT_SECONDS", "PostgresDB", "ReplicaIdInUse", "redacted", "scrubbed", "translate"]
