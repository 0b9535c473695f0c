"""Driving a gateway line by line with hostile input, and reading what reached the upstream as other
parsers would.

``LineGateway`` runs ``drawbridge wrap`` (or ``serve --stdio``) in front of the recording server
(fixtures/servers/recording.py, which writes down every line it receives) with a policy that allows
``safe_read`` (and ``two_readings``) and nothing else. ``readings`` gives the (method, id, tool) a line
means to Python's reader
and to a Go-like one: keys matched ignoring case and Unicode form, the last match winning, a key cut
at its first NUL. ``numbers_apart`` reads its numbers as JavaScript does (each the nearest double).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any

from conftest import PYTHON, SERVERS, child_env, scaled

RECORDING = [PYTHON, str(SERVERS / "recording.py")]
POLICY = (
    'name: reads\nagent: "*"\nrules:\n'
    '  - tools: ["safe_read", "fx.safe_read", "two_readings", "fx.two_readings"]\n    action: allow\n'
)
ALLOWED = frozenset({"safe_read", "two_readings"})
TIMEOUT = scaled(20.0)


def _go_key(key: str) -> str:
    return unicodedata.normalize("NFKC", key.split("\x00", 1)[0]).casefold()


def _go_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:  # the last match wins
        out[_go_key(key)] = value
    return out


def readings(line: bytes) -> list[tuple[Any, Any, Any]]:
    """What (method, id, tool name) each reader takes this line for; a reader that cannot read it is
    left out. The ids are rendered as JSON, so that 1 and 1.0 and "1" stay apart."""
    found = []
    for hook in (None, _go_object):
        try:
            message = json.loads(line, object_pairs_hook=hook) if hook else json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(message, dict):
            continue
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        found.append((message.get("method"), json.dumps(message.get("id")), name))
    return found


def _js_number(text: str) -> float | int:
    """An integer as JavaScript (and Go into an interface) reads it: the nearest double."""
    value = float(text)
    return int(value) if value.is_integer() else value


def numbers_apart(line: bytes) -> bool:
    """Whether a reader that holds numbers as doubles reads another number somewhere in the line."""
    try:
        return json.loads(line) != json.loads(line, parse_int=_js_number)
    except (ValueError, RecursionError, OverflowError):
        return False


def read_apart(lines: list[bytes]) -> list[bytes]:
    """The lines the readers take for different messages, or for other numbers."""
    return [line for line in lines if len(set(readings(line))) > 1 or numbers_apart(line)]


def refused_calls_run(lines: list[bytes]) -> list[bytes]:
    """The received lines that some reader takes for a tools/call of a tool the policy refuses."""
    bad = []
    for line in lines:
        for method, _, name in readings(line):
            if method == "tools/call" and isinstance(name, str) and name.removeprefix("fx.") not in ALLOWED:
                bad.append(line)
                break
    return bad


class LineGateway:
    """A gateway subprocess spoken to in raw lines (module docstring)."""

    def __init__(
        self, directory: Path, *, serve: bool = False, extra: tuple[str, ...] = (), limits: dict[str, Any] | None = None
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.log = directory / "received.ndjson"
        self.evidence = directory / "evidence"
        policies = directory / "policies"
        policies.mkdir(exist_ok=True)
        (policies / "reads.yaml").write_text(POLICY, encoding="utf-8")
        env = child_env({"RECORDING_LOG": str(self.log)})
        if serve:
            config = directory / "drawbridge.yaml"
            upstream = {"name": "fx", "transport": "stdio", "command": RECORDING[0], "args": RECORDING[1:],
                        "env": {"RECORDING_LOG": str(self.log)}}
            document = {"upstreams": [upstream], "policy_dir": "./policies", "evidence_dir": "./evidence",
                        "state_path": "./state.db", "limits": limits or {}}
            config.write_text(json.dumps(document))
            argv = [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio", "--agent", "fuzz", *extra]
        else:
            argv = [PYTHON, "-m", "drawbridge", "wrap", "--policy", str(policies), "--agent", "fuzz",
                    "--evidence-dir", str(self.evidence), *extra, "--", *RECORDING]
        self.prefix = "fx." if serve else ""
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=directory
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next = 0
        self.exchange({"jsonrpc": "2.0", "id": "init", "method": "initialize",
                       "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                  "clientInfo": {"name": "fuzz", "version": "0"}}})
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def send_all(self, lines: list[bytes]) -> threading.Thread:
        """Write ``lines`` from a thread (the gateway's answers must be read meanwhile, or both sides
        block on full pipes: ``drain_while`` reads them until the thread is done)."""
        def write() -> None:
            for line in lines:
                self.send(line)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        return writer

    def _read(self) -> None:
        """Read the gateway's stdout from the moment it starts, whole lines into the queue (None at its
        end): were its answers left unread while lines are sent, the gateway would block on its full
        stdout and stop reading its stdin, and a writer would wait forever, holding the pipe's lock."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        buffer = b""
        try:
            while chunk := os.read(fd, 65536):
                *whole, buffer = (buffer + chunk).split(b"\n")
                for line in whole:
                    self._lines.put(line)
        except OSError:  # closed by ``close`` once the gateway has exited
            pass
        self._lines.put(None)

    def drain_while(self, writer: threading.Thread) -> None:
        """Wait for ``writer`` to have written everything, dropping the answers read meanwhile."""
        writer.join(6 * TIMEOUT)  # thousands of lines, on a machine that may be loaded
        assert not writer.is_alive(), "the gateway stopped reading what was sent"
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line is None:
                raise EOFError("the gateway closed its stdout")

    def _line(self, deadline: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("the gateway did not answer") from None
        if line is None:
            self._lines.put(None)
            raise EOFError("the gateway closed its stdout")
        return json.loads(line)

    def exchange(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Send a well-formed request; its answer, and every line the gateway wrote before it."""
        self.send(json.dumps(message).encode())
        deadline = time.monotonic() + TIMEOUT
        before = []
        while True:
            answer = self._line(deadline)
            if answer.get("id") == message["id"] and ("result" in answer or "error" in answer):
                return answer, before
            before.append(answer)

    def call(self, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next += 1
        message = {"jsonrpc": "2.0", "id": f"well-formed-{self._next}", "method": "tools/call",
                   "params": {"name": self.prefix + tool, "arguments": arguments or {}}}
        return self.exchange(message)[0]

    def hostile(self, line: bytes) -> list[dict[str, Any]]:
        """Send a hostile line, then a well-formed read: what the gateway answered to the hostile line
        (the read must still run)."""
        self.send(line)
        self._next += 1
        probe = {"jsonrpc": "2.0", "id": f"probe-{self._next}", "method": "tools/call",
                 "params": {"name": self.prefix + "safe_read", "arguments": {}}}
        answer, before = self.exchange(probe)
        assert "result" in answer and not answer["result"].get("isError"), answer
        return before

    def received(self) -> list[bytes]:
        """What the upstream received, but the gateway's own requests (initialize, its tools/list)."""
        lines = self.log.read_bytes().splitlines() if self.log.exists() else []
        return [line for line in lines if b'"drawbridge-catalogue-' not in line and b'"initialize"' not in line]

    def trace(self) -> list[dict[str, Any]]:
        path = self.evidence / "trace.ndjson"
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []

    def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            return self.process.wait(timeout=TIMEOUT)
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
