"""A throwaway PostgreSQL cluster for the tests: initdb and pg_ctl on a temporary directory and a
loopback port, one per test session, removed at the end.

The binaries come from PATH or Debian's /usr/lib/postgresql/<version>/bin (scripts/test installs
the ``postgresql`` package). PostgreSQL refuses to run as root, so as root the cluster runs as the
``postgres`` user the package creates. Each test gets a database of its own (``fresh_database``),
so tests never see each other's rows.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from conftest import scaled
from ports import free_port

START_TIMEOUT: Final = scaled(60)
"""Seconds pg_ctl waits for the server to accept connections (a loaded machine is slow)."""
STOP_TIMEOUT: Final = scaled(60)


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not candidates:
        pytest.fail(f"{name} is missing: install Debian's postgresql package (scripts/test does)")
    return candidates[-1]


@dataclass
class Cluster:
    """A running throwaway cluster; ``url(db)`` names one of its databases."""

    data_dir: Path
    port: int
    user: str | None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://drawbridge@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), user=self.user, capture_output=True, text=True, timeout=timeout, check=False,
            cwd=self.data_dir.parent,
        )

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data_dir.parent} -c fsync=off"
        done = self._run(
            _binary("pg_ctl"), "-D", str(self.data_dir), "-o", options, "-l", str(self.data_dir.parent / "log"),
            "-w", "-t", str(round(START_TIMEOUT)), "start", timeout=START_TIMEOUT + 10,
        )
        if done.returncode != 0:
            log = (self.data_dir.parent / "log").read_text(errors="replace")[-2000:]
            pytest.fail(f"PostgreSQL did not start: {done.stderr.strip()}\n{log}")

    def stop(self, mode: str = "fast") -> None:
        self._run(_binary("pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "-t", str(round(STOP_TIMEOUT)), "stop",
                  timeout=STOP_TIMEOUT + 10)

    def ensure_running(self) -> None:
        """Start the cluster again if a test that stopped it failed before starting it."""
        if self._run(_binary("pg_ctl"), "-D", str(self.data_dir), "status", timeout=STOP_TIMEOUT).returncode != 0:
            self.start()

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """One cluster for the session, trusting loopback connections as user ``drawbridge``."""
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        owner = pwd.getpwnam(user)
    root = Path(tempfile.mkdtemp(prefix="drawbridge-pg-"))
    data = root / "data"
    if user is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    cluster = Cluster(data, free_port(), user)
    done = cluster._run(
        _binary("initdb"), "-D", str(data), "-U", "drawbridge", "--auth=trust", "-E", "UTF8", "--no-sync",
        timeout=scaled(120),
    )
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"initdb failed: {done.stderr.strip()}")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_cluster: Cluster) -> str:
    """A fresh, empty database of the session's cluster."""
    postgres_cluster.ensure_running()
    return postgres_cluster.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["sqlite", "postgresql"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a storage test keeps its state, once per backend: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    return str(request.getfixturevalue("postgres_url"))
