"""``drawbridge discover`` over all three kinds of upstream: MCP servers, OpenAPI specs (from the
configuration or ``--openapi FILE|URL``) and CLI tools, classified, and drafted into a policy."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import PYTHON, child_env, scaled
from openapi_support import SPEC, openapi_backend
from serve_support import GITHUB, write_config

from drawbridge.state.policy_store import PolicyStore

GIT = {"name": "git", "bin": "git", "commands": {"log": {"allowed_args": ["--oneline"]}}}


def _discover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", "discover", "--timeout", "20", *args],
        capture_output=True, text=True, env=child_env({"COLUMNS": "250"}), timeout=scaled(60), stdin=subprocess.DEVNULL,
    )


def _config(tmp_path: Path) -> Path:
    items = {"name": "items", "file": str(SPEC), "backend_url": "http://127.0.0.1:9/api", "allow_private": True}
    return write_config(tmp_path, [GITHUB], policies={}, openapi=[items], cli_tools=[GIT])


def _by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {tool["name"]: tool for tool in report["tools"]}


def test_the_three_kinds_are_listed_with_source_and_classification(tmp_path: Path) -> None:
    done = _discover("--config", str(_config(tmp_path)), "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    tools = _by_name(report)
    assert (tools["github.list_repos"]["source"], tools["items.get_item"]["source"]) == ("mcp", "openapi")
    get_item, create, delete = tools["items.get_item"], tools["items.create_item"], tools["items.delete_item"]
    assert get_item["classification"]["access"] == "read" and "HTTP method GET" in get_item["classification"]["reasons"]
    assert create["classification"]["access"] == "write" and "HTTP method POST" in create["classification"]["reasons"]
    assert delete["classification"]["access"] == "write"
    dispatch = tools["git.__dispatch"]
    assert dispatch["source"] == "cli" and dispatch["classification"]["family"] == "generic"
    assert "CLI dispatcher" in dispatch["classification"]["reasons"]
    assert tools["git.log"]["classification"]["family"] == "named"
    assert report["not_served"] == ["upstream 'items': GET /session: a required cookie parameter (sid) cannot be sent"]
    assert "items.get_session" not in tools


def test_the_draft_covers_openapi_and_cli_tools(tmp_path: Path) -> None:
    done = _discover("--config", str(_config(tmp_path)), "--generate-policy", "--agent", "claude")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert '# OpenAPI "items": reads through a named tool' in text
    assert '# OpenAPI "items": writes, generic tools, or no signal' in text
    assert '# CLI tool "git": writes, generic tools, or no signal' in text
    assert '#   git.__dispatch [generic, unknown] CLI dispatcher; string argument "command"' in text
    directory = tmp_path / "drafted"
    directory.mkdir()
    (directory / "draft.yaml").write_text(text, encoding="utf-8")
    store = PolicyStore.open(directory)
    expected = {
        "items.get_item": "allow", "items.list_items": "allow", "items.create_item": "human_approval",
        "items.delete_item": "human_approval", "git.__dispatch": "human_approval", "git.log": "human_approval",
        "github.list_repos": "allow",
    }
    for name, action in expected.items():
        assert store.evaluate("claude", name, {}).action.value == action, name


def test_an_ad_hoc_spec_by_file_or_by_url(tmp_path: Path) -> None:
    by_file = _discover("--openapi", str(SPEC), "--backend", "https://api.example.com/v1", "--format", "json")
    assert by_file.returncode == 0, by_file.stderr
    tools = _by_name(json.loads(by_file.stdout))
    assert tools["openapi.get_item"]["source"] == "openapi" and tools["openapi.get_item"]["server"] == "openapi"
    with openapi_backend() as backend:
        refused = _discover("--openapi", backend.spec_url, "--format", "json")
        assert refused.returncode == 2 and "refused by the SSRF guard" in refused.stderr
        assert "127.0.0.1 is a loopback address" in refused.stderr
        fetched = _discover("--openapi", backend.spec_url, "--allow-private", "--format", "json")
        assert fetched.returncode == 0, fetched.stderr
        assert "openapi.create_item" in _by_name(json.loads(fetched.stdout))
    # A spec whose server is relative needs a backend: the upstream is named as unavailable.
    no_backend = _discover("--openapi", str(SPEC), "--format", "json")
    assert no_backend.returncode == 1 and "give --backend" in no_backend.stderr and "backend_url" not in no_backend.stderr


def test_an_ad_hoc_backend_refused_by_the_ssrf_guard_advises_the_flag() -> None:
    refused = _discover("--openapi", str(SPEC), "--backend", "http://127.0.0.1:9")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "--backend is refused by the SSRF guard (127.0.0.1 is a loopback address)" in lines[0]
    assert lines[0].endswith("give --allow-private to allow it") and "allow_private" not in lines[0]
    allowed = _discover("--openapi", str(SPEC), "--backend", "http://127.0.0.1:9", "--allow-private", "--format", "json")
    assert allowed.returncode == 0, allowed.stderr


def test_the_draft_agent_glob_is_checked_before_anything_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    upstream = {"name": "m", "transport": "stdio", "command": PYTHON,
                "args": ["-c", f"open({str(marker)!r}, 'w').close()"]}
    config = tmp_path / "drawbridge.yaml"
    config.write_text(json.dumps({"upstreams": [upstream], "policy_dir": "."}), encoding="utf-8")
    for agent, problem in (("", "empty glob"), ("a[", "unterminated"), ("a\u200bb", "control or format character")):
        result = _discover("--config", str(config), "--generate-policy", "--agent", agent)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith("drawbridge: --agent ") and problem in lines[0], lines[0]
        assert result.stdout == "" and not marker.exists()
    drafted = _discover("--config", str(config), "--generate-policy", "--agent", "claude-*")
    # A good glob goes on: the upstream starts (and, answering nothing, is named as unavailable).
    assert drafted.returncode == 1 and marker.exists(), drafted.stderr
    assert "agent: \"claude-*\"" in drafted.stdout


def test_discover_reads_no_openapi_header_secret(tmp_path: Path) -> None:
    """discover calls no operation: the variable an OpenAPI entry's header names is not needed."""
    items = {"name": "items", "file": str(SPEC), "backend_url": "http://127.0.0.1:9/api", "allow_private": True,
             "headers": {"Authorization": "ITEMS_UNSET_TOKEN"}}
    config = write_config(tmp_path, [], policies={}, openapi=[items])
    done = _discover("--config", str(config), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert "items.get_item" in _by_name(json.loads(done.stdout)) and "ITEMS_UNSET_TOKEN" not in done.stderr
