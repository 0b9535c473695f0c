"""The control plane always needs a credential: an agent with a shell on the same host gets nothing.

With no admin token configured, the gateway makes one at its first start and keeps it in
``<state stem>.admin-token`` beside its state file (mode 0600), prints that file's path (never the
token), and reuses it on later starts; a file anyone else may read stops the start. The CLI finds the
token in ``--token-file``, ``DRAWBRIDGE_ADMIN_TOKEN``, or beside the state file of the ``--config``
or ``--state`` it is pointed at. Real processes: ``drawbridge wrap``, ``drawbridge serve`` and the
CLI, over real sockets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from approval_support import POLICY, cli, write_policy
from conftest import GITHUB_LIKE, PYTHON, child_env, eventually, scaled, wrap_argv
from serve_support import Running, free_port, http_gateway, serve_argv, sha256, wait_for_port, write_config

from drawbridge.gateway.runtime.admin_token import AdminTokenProblem, ensure_admin_token, token_file_for

CONTROL_LINE = re.compile(r"control plane on (http://\S+) \(admin token in (\S+)\)")


def _wrap_with_control(tmp_path: Path, port: int, *extra: str) -> list[str]:
    policy = write_policy(tmp_path, POLICY)
    return wrap_argv(GITHUB_LIKE, "--policy", str(policy), "--evidence-dir", str(tmp_path / "evidence"),
                     "--control-port", str(port), "--fsync", "never", *extra)


@contextmanager
def _wrap(argv: list[str], env: dict[str, str]) -> Iterator[Running]:
    """wrap as an MCP client launches it: its stdin stays open (an agent that has not left yet)."""
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    running = Running(process)
    thread = threading.Thread(target=lambda: running.stderr.extend(
        line.decode("utf-8", "replace") for line in process.stderr  # type: ignore[union-attr]
    ), daemon=True)
    thread.start()
    try:
        yield running
    finally:
        assert process.stdin is not None
        process.stdin.close()  # the agent leaves: wrap ends
        process.wait(scaled(30))
        thread.join(scaled(5))


def _wait_line(running: object, pattern: re.Pattern[str]) -> re.Match[str]:
    return eventually(lambda: pattern.search(running.text()), scaled(30), f"a line matching {pattern.pattern}")  # type: ignore[attr-defined]


def test_wrap_makes_a_private_token_file_and_needs_it_from_every_caller(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in child_env().items() if k != "DRAWBRIDGE_ADMIN_TOKEN"}
    with _wrap(_wrap_with_control(tmp_path, port), env) as running:
        found = _wait_line(running, CONTROL_LINE)
        url, token_file = found.group(1), Path(found.group(2))
        assert token_file == tmp_path / "evidence" / "drawbridge.admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text(encoding="ascii").strip()
        assert len(token) >= 32 and token not in running.text()
        wait_for_port(port)
        # A loopback caller without the token -- an agent with a shell on this host -- gets nothing.
        assert httpx.get(f"{url}/approvals", trust_env=False).status_code == 401
        assert httpx.post(f"{url}/grants", json={"agent": "*", "tools": "*", "duration": "1h"},
                          trust_env=False).status_code == 401
        assert httpx.get(f"{url}/approvals", headers={"Authorization": f"Bearer {token}"},
                         trust_env=False).status_code == 200
        # The CLI finds the token beside the state file, or in a file it is given.
        state = tmp_path / "evidence" / "drawbridge.db"
        by_state = cli("approvals", "list", "--url", url, "--state", str(state), env={"DRAWBRIDGE_ADMIN_TOKEN": ""})
        assert by_state.returncode == 0, by_state.stderr
        by_file = cli("grants", "list", "--url", url, "--token-file", str(token_file), env={"DRAWBRIDGE_ADMIN_TOKEN": ""})
        assert by_file.returncode == 0, by_file.stderr
        none = subprocess.run([PYTHON, "-m", "drawbridge", "approvals", "list", "--url", url], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=scaled(60))
        assert none.returncode == 1 and "no admin token found" in none.stderr and "--token-file" in none.stderr
        for result in (by_state, by_file, none):
            assert token not in result.stdout + result.stderr
    # A restart keeps the credential: the CLI's token keeps working.
    port = free_port()
    with _wrap(_wrap_with_control(tmp_path, port), env) as running:
        again = _wait_line(running, CONTROL_LINE)
        assert Path(again.group(2)).read_text(encoding="ascii").strip() == token
        wait_for_port(port)
        assert httpx.get(f"{again.group(1)}/approvals", headers={"Authorization": f"Bearer {token}"},
                         trust_env=False).status_code == 200


def test_a_token_file_others_may_read_stops_the_start_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "evidence").mkdir()
    token_file = tmp_path / "evidence" / "drawbridge.admin-token"
    token_file.write_text("x" * 43 + "\n", encoding="ascii")
    token_file.chmod(0o644)
    result = subprocess.run(_wrap_with_control(tmp_path, free_port()), input="", capture_output=True, text=True,
                            env=child_env(), timeout=scaled(60))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert any(str(token_file) in line and "mode 0644" in line for line in lines), result.stderr
    assert "x" * 43 not in result.stderr


def test_a_configured_token_makes_no_file(tmp_path: Path) -> None:
    port = free_port()
    env = {**child_env(), "DRAWBRIDGE_ADMIN_TOKEN": "a-configured-admin-token-0123456789"}
    with _wrap(_wrap_with_control(tmp_path, port), env) as running:
        _wait_line(running, re.compile(r"control plane on http://\S+ \(admin token as configured\)"))
        wait_for_port(port)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/approvals", trust_env=False).status_code == 401
        ok = httpx.get(f"{url}/approvals", headers={"Authorization": "Bearer a-configured-admin-token-0123456789"},
                       trust_env=False)
        assert ok.status_code == 200
    assert not (tmp_path / "evidence" / "drawbridge.admin-token").exists()


def test_serve_keeps_the_control_plane_apart_and_the_cli_finds_it_from_the_config(tmp_path: Path) -> None:
    port = free_port()
    upstream = {"name": "github", "transport": "stdio", "command": GITHUB_LIKE[0], "args": GITHUB_LIKE[1:]}
    config = write_config(tmp_path, [upstream], policies={"all.yaml": POLICY.replace('"', "'")}, fsync="never",
                          control={"host": "127.0.0.1", "port": port})
    with http_gateway(config) as running:
        url = running.control()
        assert url == f"http://127.0.0.1:{port}" and running.token_file == tmp_path / "drawbridge.admin-token"
        assert running.url is not None and not running.url.startswith(url)
        env = {"DRAWBRIDGE_ADMIN_TOKEN": ""}
        listed = cli("tools", "list", "--config", str(config), "--format", "json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert {tool["name"] for tool in json.loads(listed.stdout)} >= {"github.list_repos", "github.delete_repo"}
        # Where serve runs, the CLI needs nothing at all: ./drawbridge.admin-token is found.
        here = subprocess.run([PYTHON, "-m", "drawbridge", "grants", "list", "--url", url], capture_output=True,
                              text=True, env=child_env(env), cwd=tmp_path, timeout=scaled(60))
        assert here.returncode == 0, here.stderr


def test_two_gateways_on_one_state_file_share_one_token(tmp_path: Path) -> None:
    """Made once, atomically: whoever comes second reads the first one's token, never half of it."""
    path = token_file_for(tmp_path / "state.db")
    digests: list[str] = []
    threads = [threading.Thread(target=lambda: digests.append(ensure_admin_token(path))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(digests)) == 1 and len(digests) == 8
    assert sorted(os.listdir(tmp_path)) == ["state.admin-token"]  # no temporary file left behind
    link = tmp_path / "link.admin-token"
    link.symlink_to(path)
    with pytest.raises(AdminTokenProblem, match="not a regular file"):
        ensure_admin_token(link)


def _serve_once(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(serve_argv(config), input="", capture_output=True, text=True, env=child_env(env),
                          timeout=scaled(60))


@pytest.mark.parametrize("admin_env", ["GOOD", "ALSO_GOOD"])
def test_serve_refuses_an_agent_whose_token_is_the_admin_token_in_one_line(tmp_path: Path, admin_env: str) -> None:
    """An agent holding the control plane's token could approve its own calls: one variable named for
    both, or two variables holding one value, stops the start (exit 2) naming the two uses, never the value."""
    value = "one-token-for-two-uses-0123456789"
    upstream = {"name": "github", "transport": "stdio", "command": GITHUB_LIKE[0], "args": GITHUB_LIKE[1:]}
    auth = {"admin": {"token_env": admin_env}, "agents": [{"agent": "ci-bot", "token_env": "GOOD"}]}
    config = write_config(tmp_path, [upstream], auth=auth)
    result = _serve_once(config, {"GOOD": value, "ALSO_GOOD": value})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "auth.admin (the control plane) and auth.agents[0] (agent ci-bot) hold one bearer token" in lines[0]
    assert value not in result.stderr and sha256(value) not in result.stderr


def test_serve_refuses_an_agent_whose_token_is_in_the_admin_token_file(tmp_path: Path) -> None:
    """The token the gateway made for its control plane, copied into an agent's variable: refused alike."""
    token_file = token_file_for(tmp_path / "drawbridge.db")
    ensure_admin_token(token_file)
    value = token_file.read_text(encoding="ascii").strip()
    upstream = {"name": "github", "transport": "stdio", "command": GITHUB_LIKE[0], "args": GITHUB_LIKE[1:]}
    config = write_config(tmp_path, [upstream], auth={"agents": [{"agent": "ci-bot", "token_env": "GOOD"}]},
                          state_path="./drawbridge.db", evidence_dir=str(tmp_path / "evidence"))
    result = _serve_once(config, {"GOOD": value})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"the admin token file {token_file} (the control plane) and auth.agents (agent ci-bot) hold one" in lines[0]
    assert value not in result.stderr
