"""What ``drawbridge wrap`` holds while it runs as an MCP client's server runs it: a policy folder, the
evidence folder (keys made at the first run, read at the next), calls relayed, checkpoints signed.

A running wrap signs a checkpoint every few seconds, so the signer stays loaded all run long: it signs
through libsodium (``nacl``), and ``cryptography`` (its own OpenSSL, about 8.5 MiB resident, and
``bcrypt`` with it) is left to what verifies and exports. ``shutil`` and ``tempfile`` (with ``bz2`` and
``lzma``) serve only a gateway that keeps its state in a temporary folder. Each gateway is a real
process that writes the names of its loaded modules at exit (after its last checkpoint); an import of
any of these at the top of a module wrap loads would put it back here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import FIXTURES, PYTHON, child_env, scaled
from serve_support import initialize_request
from test_serve_footprint import RUN_GATEWAY

from drawbridge.evidence.tlog import open_checkpoint
from drawbridge.state.signing_keys import read_vkey

WRAP_SECONDS = scaled(60.0)
"""How long one wrap run, start to exit, may take."""
LAZY = {"cryptography", "bcrypt", "shutil", "tempfile", "bz2", "lzma"}
POLICY = 'name: footprint\nagent: "*"\nrules:\n  - tools: ["echo"]\n    action: allow\n'


def _run(tmp_path: Path, modules: Path) -> list[dict[str, object]]:
    server = [PYTHON, str(FIXTURES / "servers" / "echo_params.py")]
    argv = [PYTHON, "-c", RUN_GATEWAY, str(modules), "wrap", "--policy", str(tmp_path / "policies"),
            "--agent", "footprint", "--evidence-dir", str(tmp_path / "ev"), "--", *server]
    lines = [initialize_request(), {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    lines += [{"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "echo", "arguments": {"n": n}}}
              for n in range(2, 12)]
    done = subprocess.run(argv, input="".join(json.dumps(line) + "\n" for line in lines), capture_output=True,
                          text=True, env=child_env(), timeout=WRAP_SECONDS, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_wrap_signs_its_checkpoints_without_cryptography_at_its_first_run_and_the_next(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "footprint.yaml").write_text(POLICY)
    for run in ("first", "next"):
        modules = tmp_path / f"{run}.txt"
        answers = _run(tmp_path, modules)
        assert [a.get("id") for a in answers] == list(range(1, 12)), answers
        assert all("result" in a for a in answers), answers
        loaded = set(modules.read_text().split())
        assert "drawbridge" in loaded and "nacl" in loaded and "ruamel" in loaded  # it signed, it read YAML
        assert loaded & LAZY == set(), run
    checkpoint = (tmp_path / "ev" / "checkpoint").read_text()
    opened = open_checkpoint(checkpoint, read_vkey(tmp_path / "ev" / "keys" / "checkpoint.vkey"))
    assert opened.size == len((tmp_path / "ev" / "trace.ndjson").read_bytes().splitlines())
