"""Helpers for the ``drawbridge serve`` tests: configuration files, the gateway as a real subprocess.

Configurations are written as JSON (a subset of YAML), so a test states exactly what the file holds.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import FIXTURES, LEGACY_VERSION, PYTHON, SERVERS, child_env, eventually, scaled
from ports import free_port
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

GITHUB = {"name": "github", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "github_like.py")]}
SLACK = {"name": "slack", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "slack_like.py")]}
CRASHY = {"name": "crashy", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "crashy.py")]}
HTTP_UPSTREAM = FIXTURES / "http_upstream.py"

START_SECONDS = scaled(45.0)
"""How long serve may take to print the URL it serves."""
CONTROL_SECONDS = scaled(30.0)
"""How long serve may take to print its control plane's URL."""
STOP_SECONDS = scaled(10.0)
"""How long a stopped gateway is given to exit before it is killed."""
PORT_SECONDS = scaled(20.0)
"""How long a listener may take to accept connections."""
JOIN_SECONDS = scaled(5.0)
"""How long the thread reading a stopped gateway's stderr is given to finish."""

ALLOW_ALL = {"allow.yaml": "name: allow-all\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"}
URL_LINE = re.compile(r"serving \d+ upstream\(s\) on (http://\S+/mcp)")
CONTROL_LINE = re.compile(r"control plane on (http://\S+) \((?:admin token in (.+)|admin token as configured)\)")


TEXT_LINE = re.compile(r"^drawbridge: (INFO|WARNING) (\w+) (.*)$")


def fields_of(text: str, event: str) -> list[dict[str, str]]:
    """The ``key=value`` fields of every text activity line of ``event``."""
    found = []
    for line in text.splitlines():
        match = TEXT_LINE.match(line)
        if match and match.group(2) == event:
            found.append(dict(pair.split("=", 1) for pair in shlex.split(match.group(3))))
    return found


def everything_upstream(command: Sequence[str]) -> dict[str, Any]:
    return {"name": "everything", "transport": "stdio", "command": command[0], "args": list(command[1:])}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_config(
    directory: Path,
    upstreams: Sequence[dict[str, Any]],
    *,
    policies: dict[str, str] | None = None,
    **top: Any,
) -> Path:
    """A drawbridge.yaml in ``directory`` with the given upstreams, a policy_dir, and more top-level keys."""
    policy_dir = directory / "policies"
    policy_dir.mkdir(exist_ok=True)
    for name, text in (policies if policies is not None else ALLOW_ALL).items():
        (policy_dir / name).write_text(text, encoding="utf-8")
    document: dict[str, Any] = {"upstreams": list(upstreams), "policy_dir": "./policies", "listen": {"port": 0}}
    document.update(top)
    path = directory / "drawbridge.yaml"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def serve_argv(config: Path, *args: str) -> list[str]:
    """``drawbridge serve --config ...``. Over HTTP its control plane is put on a free port unless the
    file says where: serve binds its listeners first, and serve's default 8788 is one port that tests
    running side by side would fight over (a JSON file is changed; a YAML one is the test's own)."""
    if "--stdio" not in args:
        _free_control_port(config)
    return [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), *args]


def _free_control_port(config: Path) -> None:
    try:
        document = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(document, dict) and "control" not in document:
        document["control"] = {"port": 0}
        config.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def stdio_params(config: Path, *args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    """``drawbridge serve --config ... --stdio`` as an MCP client launches it."""
    argv = serve_argv(config, "--stdio", *args)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(env))


@dataclass
class Running:
    """A subprocess whose stderr is collected in the background (so it never blocks on a full pipe)."""

    process: subprocess.Popen[bytes]
    stderr: list[str] = field(default_factory=list)
    url: str | None = None
    config: Path | None = None
    control_url: str | None = None
    """The control plane's own listener, once serve printed it."""
    token_file: Path | None = None
    """Where serve keeps the control plane's admin token (none when one is configured)."""
    control_ready: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    """Notified after each stderr line is collected (``wait_until``)."""

    def text(self) -> str:
        return "".join(self.stderr)

    def wait_until(self, holds: Callable[[str], bool], timeout: float = START_SECONDS) -> bool:
        """Wait, without polling, until ``holds(stderr so far)``; False when ``timeout`` passed first."""
        with self.changed:
            return self.changed.wait_for(lambda: holds(self.text()), timeout)

    def control(self, timeout: float = CONTROL_SECONDS) -> str:
        """The control plane's URL, waiting for serve to print it."""
        assert self.control_ready.wait(timeout) and self.control_url is not None, self.text()
        return self.control_url

    def control_headers(self) -> dict[str, str]:
        """The operator's credential: the token serve keeps in its token file."""
        self.control()
        assert self.token_file is not None, "the admin token is configured: send it yourself"
        return {"Authorization": f"Bearer {self.token_file.read_text(encoding='ascii').strip()}"}


def _drain(running: Running, ready: threading.Event) -> None:
    assert running.process.stderr is not None
    for raw in running.process.stderr:
        line = raw.decode("utf-8", "replace")
        with running.changed:
            running.stderr.append(line)
            running.changed.notify_all()
        match = URL_LINE.search(line)
        if match:
            running.url = match.group(1)
            ready.set()
        control = CONTROL_LINE.search(line)
        if control:
            running.control_url = control.group(1)
            running.token_file = Path(control.group(2)) if control.group(2) else None
            running.control_ready.set()
    ready.set()
    running.control_ready.set()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def http_gateway(config: Path, env: dict[str, str] | None = None, timeout: float = START_SECONDS) -> Iterator[Running]:
    """``drawbridge serve --config ...`` over HTTP; yields once it printed the URL it serves (its control
    plane on a free port unless the file says where: ``serve_argv``)."""
    process = subprocess.Popen(
        serve_argv(config), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(env)
    )
    running = Running(process, config=config)
    ready = threading.Event()
    thread = threading.Thread(target=_drain, args=(running, ready), daemon=True)
    thread.start()
    try:
        ready.wait(timeout)
        if running.url is None:
            _stop(process)
            thread.join(JOIN_SECONDS)
            raise AssertionError(f"the gateway did not start:\n{running.text()}")
        yield running
    finally:
        _stop(process)
        thread.join(JOIN_SECONDS)


@contextmanager
def background(argv: Sequence[str], env: dict[str, str] | None = None) -> Iterator[Running]:
    process = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(env)
    )
    running = Running(process)
    thread = threading.Thread(target=_drain, args=(running, threading.Event()), daemon=True)
    thread.start()
    try:
        yield running
    finally:
        _stop(process)
        thread.join(JOIN_SECONDS)


def wait_for_port(port: int, timeout: float = PORT_SECONDS) -> None:
    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    eventually(listening, timeout, f"a listener on port {port}")


@asynccontextmanager
async def http_client(url: str, mode: str = "legacy", token: str | None = None, **options: Any) -> AsyncIterator[Client]:
    """An mcp SDK client over streamable HTTP, with a bearer token if given."""
    options.setdefault("cache", None)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, **options) as client:
            yield client


def initialize_request(request_id: str | int = 1) -> dict[str, Any]:
    """A 2025-11-25 ``initialize`` as a raw client sends it."""
    client = {"name": "raw", "version": "0"}
    params = {"protocolVersion": LEGACY_VERSION, "capabilities": {}, "clientInfo": client}
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}


def dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
