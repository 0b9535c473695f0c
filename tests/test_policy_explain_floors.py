"""``policy explain --config`` computes the floors a running serve applies: a CLI dispatcher's (its
``default_action`` when stricter), and with ``pin_tools`` each tool's pin status read from the state
file (never written), ``changed`` asking a person and ``new`` denied. The figures are checked against
the ``/tools/decisions`` rows of a real serve started on the same configuration and state.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
from conftest import PYTHON, child_env, eventually, scaled
from serve_support import http_gateway, write_config

ALLOW_ALL = {"allow.yaml": "name: allow-all\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"}


def _config(tmp_path: Path, log_flags: list[str], commands: tuple[str, ...] = ("log", "version")) -> Path:
    entries = {name: None for name in commands}
    entries["log"] = {"allowed_args": log_flags}
    return write_config(
        tmp_path, [], policies=ALLOW_ALL, pin_tools=True,
        cli_tools=[
            {"name": "git", "bin": "git", "working_dir": str(tmp_path), "commands": entries},
            {"name": "vault", "bin": "git", "working_dir": str(tmp_path), "default_action": "deny",
             "commands": {"version": None}},
        ],
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"},
    )


def explain(config: Path, tool: str) -> dict[str, str]:
    """The lines ``policy explain`` prints, by their label (notes and floors joined)."""
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "policy", "explain", "--config", str(config), "--agent", "guest", tool],
        capture_output=True, text=True, env=child_env(None), timeout=scaled(90),
    )
    assert result.returncode == 0, result.stderr
    lines: dict[str, str] = {}
    for line in result.stdout.splitlines():
        label, _, value = line.partition(": ")
        lines[label] = f"{lines[label]} | {value}" if label in lines else value
    return lines


def _rows(gateway: Any) -> dict[str, dict[str, Any]]:
    """The decisions once both catalogues are checked (until then every tool shows ``new``, held back):
    each upstream's ``version`` command is unchanged, so it reads ``pinned`` once its check is done."""

    def checked() -> dict[str, dict[str, Any]] | None:
        with httpx.Client(base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()) as http:
            rows = {r["name"]: r for r in http.get("/tools/decisions", params={"agent": "guest"}).json()}
        done = all(rows.get(f"{name}.version", {}).get("pin_status") == "pinned" for name in ("git", "vault"))
        return rows if done else None

    return eventually(checked, what="both catalogues checked against their pins")


def test_explain_computes_dispatcher_and_pin_floors_as_the_running_gateway_applies_them(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--oneline"])
    before = explain(config, "git.log")
    assert before["action"] == "allow" and before["floors"] == "none"
    assert "does not exist yet" in before["note"] and before["action after floors"] == "allow"
    dispatch = explain(config, "git.__dispatch")
    assert "CLI dispatcher" in dispatch["floor"]
    assert dispatch["action after floors"] == "human_approval (raised by the floor)"
    assert dispatch["approver after floors"].startswith("operator")  # a floor's question is a person's
    assert "approver after floors" not in before
    vault = explain(config, "vault.__dispatch")
    assert "default_action is deny" in vault["floor"] and vault["action after floors"].startswith("deny")
    assert not (tmp_path / "state.db").exists(), "explain wrote the state"

    with http_gateway(config) as first:  # the first run pins both catalogues as they are
        assert {row["pin_status"] for row in _rows(first).values()} == {"pinned"}
    changed = _config(tmp_path, ["--oneline", "--stat"], ("log", "version", "status"))
    found = {tool: explain(changed, tool) for tool in ("git.log", "git.status", "git.version", "git.__dispatch")}
    assert "'log' of 'git' is changed" in found["git.log"]["note"]
    assert "pin status changed" in found["git.log"]["floor"]
    assert found["git.log"]["approver after floors"].startswith("operator")
    assert "pin status new" in found["git.status"]["floor"]
    assert found["git.version"]["floors"] == "none" and "is pinned" in found["git.version"]["note"]
    # The dispatcher's definition names the declared commands: it changed too, and both floors hold.
    assert found["git.__dispatch"]["floor"].startswith("pin status changed")
    assert "| CLI dispatcher" in found["git.__dispatch"]["floor"]

    with http_gateway(changed) as second:
        rows = _rows(second)
    for tool, lines in found.items():
        action = lines["action after floors"].split(" ")[0]
        assert rows[tool]["action"] == action, (tool, rows[tool], lines)
    assert [found[t]["action after floors"].split(" ")[0] for t in ("git.log", "git.status", "git.version")] == [
        "human_approval", "deny", "allow"]


def test_explain_says_when_no_upstream_serves_the_tool(tmp_path: Path) -> None:
    lines = explain(_config(tmp_path, ["--oneline"]), "git.push")
    assert "no upstream serves 'git.push'" in lines["note"] and "action after floors" not in lines
