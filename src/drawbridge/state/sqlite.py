"""The embedded state database: one SQLite file holding approvals, grants and pins.

Invariant: every read and write of durable state goes through one ``StateDB``,
one transaction at a time, and every failure of the database (cannot open,
not a drawbridge file, corrupt page, locked past the busy timeout, closed)
surfaces as ``StateUnavailable`` with the file and the operation named. No
caller ever gets a partial answer: a transaction that fails is rolled back,
and the stores built on this turn the error into a refusal (the pin store
into "every tool of this server held back").

Theory of operation.

* The file. ``StateDB.open(path)`` creates the file with mode 0600 if needed,
  because it holds who approved what and the pinned catalogues, and tightens a
  wider mode on an existing file only when the running user owns it and it is
  empty or already a drawbridge state file (its SQLite header's application
  id): another program's or another user's file is refused unchanged. SQLite
  creates the ``-wal`` and ``-shm`` files with the mode of the database file.
  The directory must exist (the gateway makes it, and its missing parents,
  with mode 0700 whatever the umask). ``state.private_files`` holds both rules. PRAGMAs: ``journal_mode=WAL`` (readers never block the writer, and
  another process such as the CLI can resolve an approval while the gateway
  runs), ``busy_timeout`` (5 s by default: a writer waits for another writer
  instead of failing at once), ``synchronous=FULL`` (a decision the gateway
  acted on survives a power loss; the write rate here is human-paced, so the
  extra fsync costs nothing that matters), ``foreign_keys=ON``,
  ``trusted_schema=OFF`` and ``cell_size_check=ON`` (a damaged page is
  reported rather than read).
* Whose file. ``PRAGMA application_id`` is set to ``APPLICATION_ID`` on a new
  file; an existing file with another id, or with tables but no id, is not
  ours and is refused rather than migrated.
* Schema. The table ``schema_version(version, name, applied_at)`` lists the
  migrations applied. On open, inside one ``BEGIN IMMEDIATE`` transaction, the
  missing migrations of ``MIGRATIONS`` run in order; a file whose version is
  newer than this code knows is refused (an older drawbridge must not write to
  a schema it does not understand). Migrations only ever append to the tuple.
* Threads and the event loop. SQLite calls block (disk, fsync, busy waits),
  so async callers use ``await db.read(fn)`` / ``await db.write(fn)``: each
  runs ``fn(connection)`` in a worker thread through
  ``anyio.to_thread.run_sync``. There is one connection, opened with
  ``check_same_thread=False`` and guarded by a ``threading.Lock``; the lock is
  held for the whole transaction. We chose one connection and a lock over one
  connection per thread because (1) SQLite admits one writer at a time anyway,
  so per-thread connections would only add parallel reads of a small table at
  human pace; (2) anyio's worker threads come and go, so per-thread
  connections would be opened at random times and could not all be closed by
  ``close()``; (3) with the lock, "check the row is pending, then update it"
  is trivially atomic within the process, and ``BEGIN IMMEDIATE`` plus the
  busy timeout make it atomic against other processes too. Reads run in a
  deferred transaction so that several SELECTs see one snapshot.
* Cancellation. The worker thread is never abandoned: when the awaiting task
  is cancelled, the transaction still runs to its end (committed or rolled
  back) and the cancellation is delivered afterwards. A cancelled
  ``resolve`` may therefore have resolved; the stored state says which.
* Whose approvals. A gateway holds an instance lock beside the file (``hold_instance``,
  ``state.instances``) for as long as its handle is open, so another gateway's start can tell its
  approvals from those of a gateway that is gone.
* Time. Timestamps are stored as RFC 3339 UTC text of fixed width
  (``YYYY-MM-DDTHH:MM:SS.ffffffZ``), so comparing the text compares the time,
  and the same string goes into the trace chain. Callers pass aware
  datetimes; the stores never read the clock (only ``applied_at`` of a
  migration does).
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import anyio.to_thread

from drawbridge.state import instances
from drawbridge.state.errors import StateError, StateUnavailable, failure_text  # noqa: F401 -- re-exported: the stores import them from here
from drawbridge.state.private_files import secure_file

T = TypeVar("T")

APPLICATION_ID: Final = 0x64726272  # "drbr"
DEFAULT_BUSY_TIMEOUT: Final = 5.0
_TIME_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", re.ASCII)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "approvals, grants, pins",
        (
            """CREATE TABLE approvals (
                id TEXT PRIMARY KEY CHECK (length(id) = 16 AND id NOT GLOB '*[^0-9a-f]*'),
                agent TEXT NOT NULL,
                tool TEXT NOT NULL,
                args_digest TEXT NOT NULL,
                args_shape TEXT,
                shape_digest TEXT,
                reason TEXT NOT NULL,
                policy TEXT,
                source_file TEXT,
                rule_index INTEGER,
                injection TEXT NOT NULL DEFAULT '',
                status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
                created_at TEXT NOT NULL,
                expires_at TEXT NOT NULL,
                resolved_by TEXT,
                channel TEXT,
                resolution_reason TEXT,
                resolved_at TEXT,
                CHECK ((status = 'pending') = (resolved_at IS NULL))
            )""",
            "CREATE INDEX approvals_by_status ON approvals (status, expires_at)",
            "CREATE INDEX approvals_by_memory_key ON approvals (agent, tool, shape_digest, status)",
            "CREATE INDEX approvals_by_created ON approvals (created_at)",
            """CREATE TABLE grants (
                seq INTEGER PRIMARY KEY,
                id TEXT NOT NULL UNIQUE CHECK (length(id) = 16 AND id NOT GLOB '*[^0-9a-f]*'),
                agent_glob TEXT NOT NULL,
                tools_glob TEXT NOT NULL,
                created_at TEXT NOT NULL,
                expires_at TEXT NOT NULL,
                granted_by TEXT NOT NULL,
                revoked_at TEXT,
                revoked_by TEXT
            )""",
            "CREATE INDEX grants_by_expiry ON grants (expires_at)",
            """CREATE TABLE pin_servers (
                server TEXT PRIMARY KEY,
                pinned_at TEXT NOT NULL,
                pinned_by TEXT NOT NULL
            )""",
            """CREATE TABLE pins (
                server TEXT NOT NULL REFERENCES pin_servers (server),
                name TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                description TEXT,
                pinned_at TEXT NOT NULL,
                pinned_by TEXT NOT NULL,
                PRIMARY KEY (server, name)
            )""",
            """CREATE TABLE observed_servers (
                server TEXT PRIMARY KEY,
                observed_at TEXT NOT NULL
            )""",
            """CREATE TABLE observed_tools (
                server TEXT NOT NULL REFERENCES observed_servers (server),
                name TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                description TEXT,
                observed_at TEXT NOT NULL,
                PRIMARY KEY (server, name)
            )""",
        ),
    ),
    Migration(
        2,
        "approval uses: each resolution delivered to one call",
        (
            """CREATE TABLE IF NOT EXISTS approval_uses (
                approval_id TEXT PRIMARY KEY REFERENCES approvals (id),
                used_at TEXT NOT NULL,
                outcome TEXT NOT NULL CHECK (outcome IN ('approved', 'denied', 'expired'))
            )""",
        ),
    ),
    Migration(
        3,
        "who may approve (approval: operator), and the key approval memory counts under (memory_key)",
        (
            "ALTER TABLE approvals ADD COLUMN approver TEXT NOT NULL DEFAULT 'any' "
            "CHECK (approver IN ('any', 'operator'))",
            "ALTER TABLE approvals ADD COLUMN memory_digest TEXT",
            "UPDATE approvals SET memory_digest = shape_digest",
            "CREATE INDEX approvals_by_memory_digest ON approvals (agent, tool, memory_digest, status)",
        ),
    ),
    Migration(
        4,
        "replicas: who asked, the shared key ring's fingerprints, shared rate-limit buckets",
        (
            "ALTER TABLE approvals ADD COLUMN replica TEXT",
            """CREATE TABLE key_ring (
                purpose TEXT NOT NULL,
                key_id TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                first_seen TEXT NOT NULL,
                first_by TEXT NOT NULL,
                PRIMARY KEY (purpose, key_id)
            )""",
            """CREATE TABLE rate_buckets (
                bucket TEXT PRIMARY KEY,
                tokens DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL
            )""",
        ),
    ),
    Migration(
        5,
        "pinned and observed tools keep their whole definition (what the fingerprint covers)",
        (
            "ALTER TABLE pins ADD COLUMN definition TEXT",
            "ALTER TABLE observed_tools ADD COLUMN definition TEXT",
        ),
    ),
    Migration(
        6,
        "pins and observations have a kind (tool or prompt): a tool and a prompt of one name never collide",
        (
            """CREATE TABLE pin_servers_v6 (
                server TEXT NOT NULL,
                kind TEXT NOT NULL CHECK (kind IN ('tool', 'prompt')),
                pinned_at TEXT NOT NULL,
                pinned_by TEXT NOT NULL,
                PRIMARY KEY (server, kind)
            )""",
            """CREATE TABLE pins_v6 (
                server TEXT NOT NULL,
                kind TEXT NOT NULL,
                name TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                description TEXT,
                pinned_at TEXT NOT NULL,
                pinned_by TEXT NOT NULL,
                definition TEXT,
                PRIMARY KEY (server, kind, name),
                FOREIGN KEY (server, kind) REFERENCES pin_servers_v6 (server, kind)
            )""",
            """CREATE TABLE observed_servers_v6 (
                server TEXT NOT NULL,
                kind TEXT NOT NULL CHECK (kind IN ('tool', 'prompt')),
                observed_at TEXT NOT NULL,
                PRIMARY KEY (server, kind)
            )""",
            """CREATE TABLE observed_tools_v6 (
                server TEXT NOT NULL,
                kind TEXT NOT NULL,
                name TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                description TEXT,
                observed_at TEXT NOT NULL,
                definition TEXT,
                PRIMARY KEY (server, kind, name),
                FOREIGN KEY (server, kind) REFERENCES observed_servers_v6 (server, kind)
            )""",
            "INSERT INTO pin_servers_v6 (server, kind, pinned_at, pinned_by) "
            "SELECT server, 'tool', pinned_at, pinned_by FROM pin_servers",
            "INSERT INTO pins_v6 (server, kind, name, fingerprint, description, pinned_at, pinned_by, definition) "
            "SELECT server, 'tool', name, fingerprint, description, pinned_at, pinned_by, definition FROM pins",
            "INSERT INTO observed_servers_v6 (server, kind, observed_at) SELECT server, 'tool', observed_at "
            "FROM observed_servers",
            "INSERT INTO observed_tools_v6 (server, kind, name, fingerprint, description, observed_at, definition) "
            "SELECT server, 'tool', name, fingerprint, description, observed_at, definition FROM observed_tools",
            "DROP TABLE pins",
            "DROP TABLE pin_servers",
            "DROP TABLE observed_tools",
            "DROP TABLE observed_servers",
            "ALTER TABLE pin_servers_v6 RENAME TO pin_servers",
            "ALTER TABLE pins_v6 RENAME TO pins",
            "ALTER TABLE observed_servers_v6 RENAME TO observed_servers",
            "ALTER TABLE observed_tools_v6 RENAME TO observed_tools",
        ),
    ),
)
SCHEMA_VERSION: Final = MIGRATIONS[-1].version


def to_db_time(at: datetime) -> str:
    """Fixed-width RFC 3339 UTC text; ``at`` must be timezone-aware."""
    if not isinstance(at, datetime):
        raise TypeError(f"a timestamp must be a datetime, not {type(at).__name__}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware (naive datetimes are ambiguous)")
    return at.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def from_db_time(text: object) -> datetime:
    """Inverse of ``to_db_time``; anything else raises ValueError."""
    if not isinstance(text, str) or _TIME_RE.fullmatch(text) is None:
        raise ValueError("not a stored timestamp")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)


def apply_migrations(conn: Any, migrations: tuple[Migration, ...], where: str) -> None:
    """Run the migrations ``conn``'s ``schema_version`` lacks, in order, in the caller's transaction;
    a schema newer than the last of ``migrations`` is refused (an older drawbridge must not write it)."""
    newest = migrations[-1].version
    current = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
    if current > newest:
        raise StateUnavailable(
            f"{where} has schema version {current}, newer than this drawbridge supports ({newest}); "
            "use a newer drawbridge or another state file"
        )
    for migration in migrations:
        if migration.version <= current:
            continue
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
            (migration.version, migration.name, to_db_time(datetime.now(UTC))),
        )


def _describe(exc: sqlite3.Error) -> str:
    return str(exc) or type(exc).__name__


class StateDB:
    """The open state database. Build with ``StateDB.open`` (or ``await StateDB.open_async``)."""

    kind: Final = "sqlite"
    shared: Final = False
    """One machine's file: what other replicas need (notifications, shared counters) is not here."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = connection
        self._lock = threading.Lock()
        self.replica_id: str | None = None
        self._instance: instances.InstanceLock | None = None

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> StateDB:
        """Open (creating if needed) and migrate the database. Blocking: call at startup or via open_async."""
        db_path = Path(path)
        secure_file(db_path, APPLICATION_ID)
        try:
            conn = sqlite3.connect(
                str(db_path), timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StateUnavailable(f"cannot open the state database {db_path}: {_describe(exc)}") from None
        try:
            cls._configure(conn, db_path, busy_timeout)
            cls._migrate(conn, db_path)
        except BaseException:
            conn.close()
            raise
        return cls(db_path, conn)

    @classmethod
    async def open_async(
        cls, path: str | os.PathLike[str], *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    ) -> StateDB:
        return await anyio.to_thread.run_sync(functools.partial(cls.open, path, busy_timeout=busy_timeout))

    @staticmethod
    def _configure(conn: sqlite3.Connection, path: Path, busy_timeout: float) -> None:
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StateUnavailable(
                    f"cannot open the state database {path}: WAL journal mode unavailable (got {mode!r})"
                )
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA trusted_schema = OFF")
            conn.execute("PRAGMA cell_size_check = ON")
        except sqlite3.Error as exc:
            raise StateUnavailable(f"cannot open the state database {path}: {_describe(exc)}") from None

    @staticmethod
    def _migrate(conn: sqlite3.Connection, path: Path) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
                tables = [
                    row[0]
                    for row in conn.execute(
                        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                    )
                ]
                if app_id == 0 and not tables:
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    conn.execute(
                        "CREATE TABLE schema_version ("
                        "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
                    )
                elif app_id != APPLICATION_ID:
                    raise StateUnavailable(
                        f"{path} is not a drawbridge state database "
                        f"(application_id {app_id:#x}, {len(tables)} tables); refusing to use it"
                    )
                apply_migrations(conn, MIGRATIONS, f"state database {path}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StateUnavailable(f"cannot open the state database {path}: {_describe(exc)}") from None

    # -- properties ----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def label(self) -> str:
        return str(self._path)

    @property
    def closed(self) -> bool:
        return self._conn is None

    # -- transactions --------------------------------------------------------------------------

    def _run(self, fn: Callable[[sqlite3.Connection], T], what: str, *, write: bool) -> T:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StateUnavailable(f"state database {self._path} is closed ({what})", detail=f"{what}: closed")
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = fn(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StateUnavailable(
                    f"state database {self._path}: {what}: {_describe(exc)}", detail=f"{what}: {_describe(exc)}"
                ) from None
            return result

    def read_sync(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``fn`` in a read transaction in this thread (startup, CLI, tests)."""
        return self._run(fn, what, write=False)

    def write_sync(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``fn`` in a ``BEGIN IMMEDIATE`` transaction in this thread; any exception rolls it back."""
        return self._run(fn, what, write=True)

    async def read(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """``read_sync`` in a worker thread, off the event loop."""
        return await anyio.to_thread.run_sync(functools.partial(self._run, fn, what, write=False))

    async def write(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """``write_sync`` in a worker thread, off the event loop."""
        return await anyio.to_thread.run_sync(functools.partial(self._run, fn, what, write=True))

    # -- maintenance ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        return self.read_sync(
            lambda c: int(c.execute("SELECT max(version) FROM schema_version").fetchone()[0]),
            "read schema version",
        )

    def quick_check(self) -> list[str]:
        """``PRAGMA quick_check``: ``["ok"]`` for a sound file, else SQLite's list of problems."""
        return self.read_sync(lambda c: [str(r[0]) for r in c.execute("PRAGMA quick_check")], "quick check")

    def hold_instance(self) -> str:
        """Make this handle one running gateway on the file (``state.instances``): the approvals it opens
        carry its instance id, and no other gateway's start ends them while it runs. Returns the id."""
        if self._instance is None:
            self._instance = instances.hold(self._path)
            self.replica_id = self._instance.instance_id
        return self._instance.instance_id

    def close(self) -> None:
        """Close the connection (checkpointing the WAL), then let go of the instance lock. Idempotent;
        later calls raise StateUnavailable."""
        with self._lock:
            conn, self._conn = self._conn, None
            instance, self._instance = self._instance, None
        if conn is not None:
            conn.close()
        if instance is not None:
            instance.release()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
