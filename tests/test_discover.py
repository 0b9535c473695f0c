"""``drawbridge discover``: real upstream processes, the table, the JSON report, and a draft policy that
the policy loader accepts and that decides as the page says (named reads allow, the rest needs a
human, anything unlisted is denied). Expected classifications are written here by hand."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, child_env, scaled
from serve_support import GITHUB, SLACK, write_config

from drawbridge.state.policy_store import PolicyStore

EXPECTED = {
    # name: (server, family, access)
    "github.list_repos": ("github", "named", "read"),
    "github.get_repo": ("github", "named", "read"),
    "github.add_deploy_key": ("github", "named", "write"),
    "github.delete_repo": ("github", "named", "write"),
    "slack.list_channels": ("slack", "named", "read"),
    "slack.invite": ("slack", "named", "write"),
    "slack.add_member": ("slack", "named", "write"),
}


def _discover(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", "discover", "--config", str(config), "--timeout", "20", *args],
        capture_output=True, text=True, env=child_env({"COLUMNS": "250"}), timeout=scaled(60),
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("discover")
    return write_config(directory, [GITHUB, SLACK], policies={})


def test_the_table_lists_every_tool_with_family_access_and_reasons(config: Path) -> None:
    done = _discover(config)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│")]
    cells = {parts[1]: parts for parts in ([c.strip() for c in row.strip().strip("│").split("│")] for row in rows)}
    assert set(cells) == set(EXPECTED)
    for name, (server, family, access) in EXPECTED.items():
        assert cells[name][0] == server and cells[name][2:4] == [family, access], cells[name]
    assert 'name verb "delete"' in cells["github.delete_repo"][4]
    assert "annotation destructiveHint: true" in cells["github.delete_repo"][4]
    # Nothing of the gateway was started: no evidence, no state.
    assert not (config.parent / "evidence").exists() and not (config.parent / "drawbridge.db").exists()


def test_the_json_report_carries_the_classification_of_each_tool(config: Path) -> None:
    done = _discover(config, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    got = {t["name"]: (t["server"], t["classification"]["family"], t["classification"]["access"]) for t in report["tools"]}
    assert got == EXPECTED
    assert all(t["classification"]["reasons"] for t in report["tools"])
    assert (report["unavailable"], report["not_served"]) == ([], [])
    assert "policy" not in report


def test_the_draft_policy_loads_and_decides_as_the_page_says(config: Path, tmp_path: Path) -> None:
    done = _discover(config, "--generate-policy", "--agent", "claude")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for name, (server, family, access) in EXPECTED.items():
        comment = re.search(rf"^  #   {re.escape(name)} \[{family}, {access}\] .+$", text, re.MULTILINE)
        assert comment is not None, name
    assert '# MCP server "github": reads through a named tool' in text
    assert '# MCP server "slack": writes, generic tools, or no signal' in text

    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "draft.yaml").write_text(text, encoding="utf-8")
    store = PolicyStore.open(directory)  # raises PolicyLoadError if the draft does not load
    for name, (_server, _family, access) in EXPECTED.items():
        decision = store.evaluate("claude", name, {})
        assert decision.action.value == ("allow" if access == "read" else "human_approval"), name
        assert decision.source_file is not None and decision.source_file.endswith("draft.yaml")
    assert store.evaluate("claude", "github.something_new", {}).action.value == "deny"
    assert store.evaluate("another-agent", "github.list_repos", {}).action.value == "deny"


def test_an_upstream_that_cannot_be_reached_is_named_and_the_others_still_listed(tmp_path: Path) -> None:
    missing: dict[str, Any] = {"name": "missing", "transport": "streamable_http", "url": "http://127.0.0.1:9/mcp"}
    config = write_config(tmp_path, [GITHUB, missing], policies={})
    done = _discover(config, "--format", "json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert {t["server"] for t in report["tools"]} == {"github"}
    assert len(report["unavailable"]) == 1 and "'missing'" in report["unavailable"][0]
    assert "upstream 'missing' could not be read" in done.stderr
