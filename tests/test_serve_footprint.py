"""What a running serve holds: over HTTP with static tokens, SQLite state and stdio upstreams, having
answered handshake-era calls and a control-plane request, it has loaded none of the libraries only
other configurations need.

The gateway is a real ``drawbridge serve`` whose process writes the names of its loaded modules at
exit (it is stopped with SIGTERM, as an operator stops it). The `mcp` SDK and its pydantic types come
with the 2026-07-28 era or an HTTP upstream (``sdk_parts.inbound``), PyJWT and the HTTP client with
OAuth, psycopg with PostgreSQL state, jinja2 with the first console page: each import left at the top
of a module serve loads would put it back here.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from conftest import PYTHON
from serve_support import GITHUB, START_SECONDS, background, initialize_request, sha256, write_config

TOKEN = "footprint-token"
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
NOT_LOADED = {"mcp", "mcp_types", "pydantic", "jwt", "httpx", "psycopg", "psycopg_pool", "jinja2"}
RUN_SERVE = """
import atexit, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted({m.split(".")[0] for m in sys.modules}))))
sys.argv = ["drawbridge", "serve", "--config", sys.argv[2]]
runpy.run_module("drawbridge", run_name="__main__")
"""


def test_serve_over_http_with_stdio_upstreams_holds_only_what_it_runs_with(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, [GITHUB], auth={"agents": [{"agent": "ops", "token_sha256": sha256(TOKEN)}]}, control={"port": 0}
    )
    modules = tmp_path / "modules.txt"
    with background([PYTHON, "-c", RUN_SERVE, str(modules), str(config)]) as running:
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

