"""What a running gateway holds: serve over HTTP with static tokens, SQLite state and stdio upstreams,
having answered handshake-era calls and a control-plane request, and wrap without a control plane,
having relayed a call, have loaded none of the libraries only other configurations need.

Each gateway is a real ``drawbridge`` process that writes the names of its loaded modules at exit
(serve is stopped with SIGTERM, as an operator stops it; wrap sees the end of its stdin). The ``mcp``
SDK and its pydantic types come with the 2026-07-28 era or an HTTP upstream (``sdk_parts.inbound``),
PyJWT and the HTTP client with OAuth, psycopg with PostgreSQL state, jinja2 with the first console
page, prometheus_client with the first scrape, the web stack with a control plane, cryptography with
verifying or exporting evidence (checkpoints are signed through libsodium): each import left at the
top of a module the gateway loads would put it back here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
from conftest import PYTHON, SERVERS, child_env
from serve_support import GITHUB, START_SECONDS, background, initialize_request, sha256, write_config

TOKEN = "footprint-token"
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
NOT_LOADED = {"mcp", "mcp_types", "pydantic", "jwt", "httpx", "psycopg", "psycopg_pool", "jinja2", "cryptography"}
WRAP_NOT_LOADED = NOT_LOADED | {"prometheus_client", "starlette", "uvicorn"}
RUN_GATEWAY = """
import atexit, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted({m.split(".")[0] for m in sys.modules}))))
sys.argv = ["drawbridge", *sys.argv[2:]]
runpy.run_module("drawbridge", run_name="__main__")
"""


def test_serve_over_http_with_stdio_upstreams_holds_only_what_it_runs_with(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, [GITHUB], auth={"agents": [{"agent": "ops", "token_sha256": sha256(TOKEN)}]}, control={"port": 0}
    )
    modules = tmp_path / "modules.txt"
    with background([PYTHON, "-c", RUN_GATEWAY, str(modules), "serve", "--config", str(config)]) as running:
        assert running.wait_until(lambda text: running.url is not None, START_SECONDS), running.text()
        assert running.url is not None
        headers = {**JSON_HEADERS, "authorization": f"Bearer {TOKEN}"}
        with httpx.Client(headers=headers, timeout=START_SECONDS) as client:
            hello = client.post(running.url, content=json.dumps(initialize_request()))
            assert hello.status_code == 200, hello.text
            session = {"mcp-session-id": hello.headers["mcp-session-id"]}
            client.post(running.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
            listed = client.post(running.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session)
            name = listed.json()["result"]["tools"][0]["name"]
            call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": name, "arguments": {}}}
            answer = client.post(running.url, json=call, headers=session)
            assert answer.status_code == 200 and answer.json()["id"] == 3, answer.text
            tools = client.get(running.control() + "/tools", headers=running.control_headers())
            assert tools.status_code == 200, tools.text
        running.process.terminate()
        assert running.process.wait(START_SECONDS) is not None
    assert running.process.returncode != -9 and modules.exists(), running.text()
    loaded = set(modules.read_text().split())
    assert "drawbridge" in loaded and "starlette" in loaded  # the dump is of the gateway that served
    assert loaded & NOT_LOADED == set()


def test_wrap_without_a_control_plane_holds_no_metrics_and_no_web_stack(tmp_path: Path) -> None:
    modules = tmp_path / "modules.txt"
    server = [PYTHON, str(SERVERS / "github_like.py")]
    argv = [PYTHON, "-c", RUN_GATEWAY, str(modules), "wrap", "--allow-all", "--evidence-dir", str(tmp_path / "ev"), "--"]
    lines = [
        initialize_request(),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    process = subprocess.Popen(
        argv + server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), text=True
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        for line in lines:
            process.stdin.write(json.dumps(line) + "\n")
        process.stdin.flush()
        answers = [json.loads(process.stdout.readline()) for _ in range(2)]  # then the end of its stdin
        process.stdin.close()
        assert process.wait(START_SECONDS) == 0, process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert [a.get("id") for a in answers] == [1, 2] and answers[1]["result"]["tools"], answers
    loaded = set(modules.read_text().split())
    assert "drawbridge" in loaded and "anyio" in loaded
    assert loaded & WRAP_NOT_LOADED == set()
