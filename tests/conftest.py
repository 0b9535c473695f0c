"""Shared test fixtures: real MCP servers, the gateway as a subprocess, and a raw JSON-lines pipe.

Nothing here is skipped: a missing server is a failure that says how to install it.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from anyio.abc import Process
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SERVERS = FIXTURES / "servers"
HARNESS = FIXTURES / "relay_harness.py"
PYTHON = sys.executable
"""The interpreter running the tests: the project's venv python."""

GITHUB_LIKE = [PYTHON, str(SERVERS / "github_like.py")]
SLACK_LIKE = [PYTHON, str(SERVERS / "slack_like.py")]
CRASHY = [PYTHON, str(SERVERS / "crashy.py")]

TIMEOUT_SCALE = float(os.environ.get("DRAWBRIDGE_TEST_TIMEOUT_SCALE") or "1")
"""How much longer than on a quiet machine the tests wait for anything (a gateway to start, a line, an
answer): every timeout of the support modules is a constant times this. Set
``DRAWBRIDGE_TEST_TIMEOUT_SCALE=3`` on a loaded machine; it never shortens a wait below its constant."""


def timeout_scale() -> float:
    return max(TIMEOUT_SCALE, 1.0)


def scaled(seconds: float) -> float:
    """A test timeout of ``seconds`` on a quiet machine, scaled for this one (``TIMEOUT_SCALE``)."""
    return seconds * timeout_scale()


EXAMPLES_SCALE = float(os.environ.get("DRAWBRIDGE_TEST_EXAMPLES_SCALE") or "1")
"""How many more examples than usual the slowest property tests draw (``examples``): 1 in CI, more
for a thorough run (``DRAWBRIDGE_TEST_EXAMPLES_SCALE=3`` draws what they drew before this setting)."""


def examples(count: int) -> int:
    """A property test's example count, scaled by ``EXAMPLES_SCALE`` (never below 10)."""
    return max(10, round(count * EXAMPLES_SCALE))


# Below the scale: postgres_support takes its timeouts from it.
from postgres_support import postgres_cluster, postgres_url, state  # noqa: E402, F401  (fixtures: a throwaway PostgreSQL)

PIPE_SECONDS = scaled(15.0)
"""How long a raw pipe waits for the gateway's next line."""
EXIT_SECONDS = scaled(8.0)
"""How long a child is given to exit once its stdin is closed."""
WAIT_SECONDS = scaled(15.0)
"""How long ``eventually`` waits for a condition (a record, a line, a state) unless told otherwise."""
POLL_SECONDS = 0.02
"""The pause between two looks at a condition: short, so a wait ends soon after the event; it is no
timeout, so it does not scale."""

T = TypeVar("T")


def _late(what: str, timeout: float, error: BaseException | None) -> AssertionError:
    cause = f" (last error: {error!r})" if error is not None else ""
    return AssertionError(f"{what} did not happen within {timeout:.1f} s{cause}")


def eventually(
    check: Callable[[], T], timeout: float = WAIT_SECONDS, what: str = "the awaited condition",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``check()``'s first truthy value, looked at every ``POLL_SECONDS`` until ``timeout``. A test waits
    on the event itself (a record written, a state reached) rather than on a guess at how long it takes,
    so it passes on a loaded machine and is quick on a quiet one. ``ignoring`` names errors that mean
    "not yet" (a listener still starting)."""
    deadline = time.monotonic() + timeout
    error: BaseException | None = None
    while True:
        try:
            value = check()
        except ignoring as caught:
            value, error = None, caught  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() > deadline:
            raise _late(what, timeout, error)
        time.sleep(POLL_SECONDS)


async def eventually_async(
    check: Callable[[], T | Awaitable[T]], timeout: float = WAIT_SECONDS, what: str = "the awaited condition",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``eventually`` for async tests: ``check`` may be a coroutine function; the loop keeps running."""
    deadline = time.monotonic() + timeout
    error: BaseException | None = None
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as caught:
            value, error = None, caught
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise _late(what, timeout, error)
        await anyio.sleep(POLL_SECONDS)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """pytest-timeout's per-test limit (pyproject's ``timeout``) grows with the scale too."""
    if timeout_scale() > 1 and config.getvalue("timeout") is None:
        ini = config.getini("timeout")
        if ini:
            config.option.timeout = float(ini) * timeout_scale()


MODERN = "2026-07-28"
LEGACY_VERSION = "2025-11-25"
ERAS = ("legacy", MODERN)
"""Client connect modes: the initialize handshake (2025-11-25) and the stateless 2026-07-28 era."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def server_everything_command() -> list[str]:
    binary = ROOT / ".node" / "node_modules" / ".bin" / "mcp-server-everything"
    if not binary.exists():
        pytest.fail(
            f"{binary} is missing: run .ci/run, or "
            "`npm install --prefix .node @modelcontextprotocol/server-everything`",
            pytrace=False,
        )
    return [str(binary), "stdio"]


def mcp_server_time_command() -> list[str]:
    binary = Path(PYTHON).parent / "mcp-server-time"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: pip install mcp-server-time into the venv (.ci/run does)", pytrace=False)
    return [str(binary), "--local-timezone", "UTC"]


@pytest.fixture
def everything() -> list[str]:
    return server_everything_command()


@pytest.fixture
def time_server() -> list[str]:
    return mcp_server_time_command()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the gateway: ours, quiet node warnings, plus extras."""
    env = dict(os.environ)
    env.setdefault("NODE_NO_WARNINGS", "1")
    env.update(extra or {})
    return env


def direct_params(server: Sequence[str], env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=server[0], args=list(server[1:]), env=child_env(env))


def wrap_params(
    server: Sequence[str], *wrap_args: str, env: dict[str, str] | None = None
) -> StdioServerParameters:
    """``drawbridge wrap [wrap_args] -- server...`` as the MCP client launches it."""
    return StdioServerParameters(
        command=PYTHON, args=["-m", "drawbridge", "wrap", *wrap_args, "--", *server], env=child_env(env)
    )


@dataclass
class Harness:
    """The relay with scripted decisions (``fixtures/relay_harness.py``) and its records file."""

    records_path: Path
    server: Sequence[str]
    deny: Sequence[str] = ()
    approval: Sequence[str] = ()
    explode: Sequence[str] = ()
    slow_decision: Sequence[str] = ()
    call_timeout: float = 30.0
    max_message_bytes: int | None = None
    max_upstream_message_bytes: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        args = [PYTHON, str(HARNESS), "--records", str(self.records_path), "--call-timeout", str(self.call_timeout)]
        for flag, names in (
            ("--deny", self.deny),
            ("--approval", self.approval),
            ("--explode", self.explode),
            ("--slow-decision", self.slow_decision),
        ):
            for name in names:
                args += [flag, name]
        if self.max_message_bytes is not None:
            args += ["--max-message-bytes", str(self.max_message_bytes)]
        if self.max_upstream_message_bytes is not None:
            args += ["--max-upstream-message-bytes", str(self.max_upstream_message_bytes)]
        return [*args, "--", *self.server]

    def params(self) -> StdioServerParameters:
        argv = self.argv()
        return StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(self.env))

    def records(self) -> list[dict[str, Any]]:
        if not self.records_path.exists():
            return []
        return [json.loads(line) for line in self.records_path.read_text(encoding="utf-8").splitlines()]

    def calls(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["event"] == "call"]

    def incidents(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["event"] == "incident"]


@pytest.fixture
def harness(tmp_path: Path):
    def make(server: Sequence[str], **options: Any) -> Harness:
        return Harness(records_path=tmp_path / "records.jsonl", server=server, **options)

    return make


@asynccontextmanager
async def connect(params: StdioServerParameters, mode: str = "legacy", **options: Any) -> AsyncIterator[Client]:
    """An mcp SDK client session over stdio to ``params`` (the gateway or a server), in the given era."""
    options.setdefault("cache", None)
    async with Client(params, mode=mode, **options) as client:
        yield client


# ------------------------------------------------------------------------------------- raw pipe


class RawPipe:
    """Newline-delimited JSON over a process's stdin/stdout, for byte-level tests."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self._buffer = b""
        self.notifications: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        assert self.process.stdin is not None
        await self.process.stdin.send(data)

    async def recv_line(self, timeout: float = PIPE_SECONDS) -> bytes:
        assert self.process.stdout is not None
        with anyio.fail_after(timeout):
            while b"\n" not in self._buffer:
                self._buffer += await self.process.stdout.receive(65536)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def recv(self, timeout: float = PIPE_SECONDS) -> dict[str, Any]:
        return json.loads(await self.recv_line(timeout))

    async def response_line(self, request_id: Any, timeout: float = PIPE_SECONDS) -> bytes:
        """The raw line answering ``request_id``; notifications and server requests seen meanwhile are kept."""
        while True:
            line = await self.recv_line(timeout)
            message = json.loads(line)
            if "method" not in message and message.get("id") == request_id:
                return line
            self.notifications.append(message)

    async def request(self, request_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return json.loads(await self.response_line(request_id))

    async def initialize(self, version: str = LEGACY_VERSION) -> dict[str, Any]:
        response = await self.request(
            "init",
            "initialize",
            {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "0"}},
        )
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response


@asynccontextmanager
async def raw_pipe(argv: Sequence[str], env: dict[str, str] | None = None) -> AsyncIterator[RawPipe]:
    process = await anyio.open_process(
        list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=child_env(env)
    )
    pipe = RawPipe(process)
    try:
        yield pipe
    finally:
        with anyio.CancelScope(shield=True):
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.move_on_after(EXIT_SECONDS):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


def spy_upstream_writes(relay: Any, waiting: list[bytes] | None = None) -> list[bytes]:
    """What an in-process relay hands the upstream's pipe without waiting, one item per write (whether
    the pipe took it or not), and in ``waiting`` what it writes waiting for the pipe: a test waits on a
    line's hand-over instead of guessing its time."""
    written: list[bytes] = []
    real, real_send = relay.upstream.send_nowait, relay.upstream.send

    def spy(data: bytes) -> bool:
        written.append(data)
        return bool(real(data))

    async def spy_send(data: bytes) -> None:
        if waiting is not None:
            waiting.append(data)
        await real_send(data)

    relay.upstream.send_nowait = spy
    relay.upstream.send = spy_send
    return written


def wrap_argv(server: Sequence[str], *wrap_args: str) -> list[str]:
    return [PYTHON, "-m", "drawbridge", "wrap", *wrap_args, "--", *server]
