"""What the gateway refuses about its SQLite state file before it opens it: a URL given as its path, a
file that is not its own (left exactly as it was), and what it creates (directories 0700 under any
umask); each a one-line startup error that says the path once."""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
from approval_support import cli, write_policy
from conftest import GITHUB_LIKE, PYTHON, child_env, scaled
from replica_support import recording_upstream

from drawbridge.gateway.runtime.assembly import StartupProblem, open_state
from drawbridge.state.sqlite import StateDB, StateUnavailable

URL = "postgresql://drawbridge:S3cretPw@127.0.0.1:1/db"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _serve(tmp_path: Path, **top: object) -> subprocess.CompletedProcess[str]:
    (tmp_path / "policies").mkdir(exist_ok=True)
    (tmp_path / "policies" / "p.yaml").write_text("name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n")
    config = tmp_path / "drawbridge.yaml"
    config.write_text(json.dumps({
        "upstreams": [recording_upstream(tmp_path / "log")], "policy_dir": "./policies",
        "evidence_dir": str(tmp_path / "evidence"), "pin_tools": True, **top,
    }))
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio"], input="", check=False,
        capture_output=True, text=True, env=child_env(), timeout=scaled(60), cwd=tmp_path,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_url_as_state_path_is_refused_and_makes_no_directory(tmp_path: Path) -> None:
    line = _one_line(_serve(tmp_path, state_path=URL))
    assert "state_path is a URL, not a SQLite file path" in line, line
    assert "S3cretPw" not in line and "127.0.0.1" not in line
    assert not (tmp_path / "postgresql:").exists()


def test_a_url_as_wraps_state_is_refused_and_makes_no_directory(tmp_path: Path) -> None:
    done = cli("wrap", "--policy", str(write_policy(tmp_path)), "--evidence-dir", str(tmp_path / "ev"),
               "--state", URL, "--", *GITHUB_LIKE)
    line = _one_line(done)
    assert "is a URL, not a SQLite file path" in line and "S3cretPw" not in line, line
    assert not Path("postgresql:").exists() and not (tmp_path / "postgresql:").exists()


def test_a_file_that_cannot_be_opened_is_named_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"SQLite format 3\x00" + bytes(84) + os.urandom(8092))  # a header SQLite rejects
    path.chmod(0o600)
    line = _one_line(_serve(tmp_path, state_path=str(path)))
    assert line.count(str(path)) == 1 and "not a database" in line, line
    assert "cannot open state database" not in line


@pytest.mark.parametrize("kind", ["text", "foreign sqlite"])
def test_a_wide_file_that_is_not_a_state_database_is_refused_unchanged(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "state.db"
    if kind == "text":
        path.write_text("notes: not a database\n")
    else:
        with sqlite3.connect(path) as raw:
            raw.execute("CREATE TABLE customers (id INTEGER)")
    path.chmod(0o644)
    with pytest.raises(StateUnavailable, match="not a drawbridge state database"):
        StateDB.open(path)
    assert _mode(path) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's file can be made only as root")
def test_another_users_wide_state_file_is_refused_and_never_changed(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateDB.open(path).close()
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    path.chmod(0o644)
    with pytest.raises(StateUnavailable, match="belongs to another user"):
        StateDB.open(path)
    assert _mode(path) == 0o644 and path.stat().st_uid == nobody.pw_uid


def test_state_directories_are_made_0700_under_any_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        db, _ = open_state(str(tmp_path / "made" / "deeper" / "state.db"))
        db.close()
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "made") == 0o700 and _mode(tmp_path / "made" / "deeper") == 0o700
    assert _mode(tmp_path / "made" / "deeper" / "state.db") == 0o600


def test_open_state_refuses_a_url_without_repeating_it() -> None:
    with pytest.raises(StartupProblem) as refused:
        open_state(URL)
    assert "S3cretPw" not in str(refused.value) and "is a URL" in str(refused.value)
