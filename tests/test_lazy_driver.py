"""A gateway on its SQLite state never loads the PostgreSQL driver: psycopg is imported when a shared
state is opened (``PostgresDB.open``), not at startup, so wrap and serve start without it."""

from __future__ import annotations

import subprocess

from conftest import PYTHON, child_env, scaled

PROBE = """
import sys
import drawbridge.cli.main, drawbridge.cli.wrap_cmd, drawbridge.cli.serve_cmd
import drawbridge.gateway.runtime.assembly, drawbridge.state.backend, drawbridge.state.postgres
print(",".join(sorted(name for name in ("psycopg", "psycopg_pool") if name in sys.modules)))
"""


def test_the_gateway_modules_load_without_the_postgresql_driver() -> None:
    loaded = subprocess.run([PYTHON, "-c", PROBE], capture_output=True, text=True, env=child_env(None),
                            timeout=scaled(60))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "", f"imported at startup: {loaded.stdout.strip()}"


def test_opening_a_shared_state_loads_the_driver() -> None:
    probe = ("import sys\nfrom drawbridge.state.postgres import PostgresDB\nfrom drawbridge.state.sqlite import StateUnavailable\n"
             "try:\n    PostgresDB.open('postgresql://nobody@127.0.0.1:1/none', timeout=0.5)\n"
             "except StateUnavailable as exc:\n    print('refused:', exc)\n"
             "print('psycopg' in sys.modules)\n")
    opened = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, env=child_env(None),
                            timeout=scaled(60))
    assert opened.returncode == 0, opened.stderr
    refused, loaded = opened.stdout.strip().splitlines()
    assert refused.startswith("refused: cannot connect to the state database") and loaded == "True"
