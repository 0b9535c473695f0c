"""wrap starts its server while the gateway imports, and a gateway that then cannot start stops it
before the server has heard a line.

The server here is a script that writes its pid when it starts and, at the end of its stdin, what it
was sent; the gateway is refused at start by a policy that does not load and by an evidence directory
another gateway writes. In both cases: exit 2 with one line, the server saw its stdin end without a
byte, and it is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import PYTHON, child_env, eventually, scaled
from one_reading_support import LineGateway

GONE_SECONDS = scaled(10.0)
"""How long the stopped server may take to be gone (it is stopped before wrap exits)."""
WRAP_SECONDS = scaled(60.0)
"""How long one wrap run, start to exit, may take."""
SERVER = """
import json, os, sys
out = sys.argv[1]
open(out + ".pid", "w").write(str(os.getpid()))
heard = sys.stdin.buffer.read()
open(out, "w").write(json.dumps({"heard": heard.decode("latin-1")}))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


def _wrap(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    report = tmp_path / "server.json"
    argv = [PYTHON, "-m", "drawbridge", "wrap", *options, "--", PYTHON, "-c", SERVER, str(report)]
    result = subprocess.run(
        argv, input="", capture_output=True, text=True, env=child_env(), timeout=WRAP_SECONDS, check=False
    )
    return result, report


def _stopped_unheard(result: subprocess.CompletedProcess[str], report: Path) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    pid = int(report.with_name(report.name + ".pid").read_text())  # it was started, while the gateway imported
    eventually(lambda: not _alive(pid), GONE_SECONDS, "the end of the server of a gateway that did not start")
    assert json.loads(report.read_text()) == {"heard": ""}


def test_a_policy_that_does_not_load_stops_the_server_unheard(tmp_path: Path) -> None:
    policy = tmp_path / "policies"
    policy.mkdir()
    (policy / "bad.yaml").write_text("name: [\n")
    result, report = _wrap(tmp_path, "--policy", str(policy))
    assert "cannot load the policy" in result.stderr
    _stopped_unheard(result, report)


def test_an_evidence_directory_in_use_stops_the_server_unheard(tmp_path: Path) -> None:
    first = LineGateway(tmp_path / "first")
    try:
        result, report = _wrap(tmp_path, "--allow-all", "--evidence-dir", str(first.evidence))
        assert "another gateway" in result.stderr
        _stopped_unheard(result, report)
    finally:
        assert first.close() == 0


def test_a_server_that_starts_is_served(tmp_path: Path) -> None:
    """The early start is the same server the relay then speaks to: it hears the agent's line."""
    report = tmp_path / "server.json"
    argv = [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--", PYTHON, "-c", SERVER, str(report)]
    line = '{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
    result = subprocess.run(
        argv, input=line, capture_output=True, text=True, env=child_env(), timeout=WRAP_SECONDS, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(report.read_text())["heard"].startswith(line)
