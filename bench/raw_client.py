"""A raw JSON-lines MCP client over a child's pipes: blocking reads and writes, lines built once.

It costs the measurement almost nothing, so what it sees is what the process under test adds (an
SDK client on an event loop hides part of the server's work behind its own and caps what it can
drive). Every answer is checked: the right id, a result, no ``isError``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

PROTOCOL = "2025-11-25"


def rss_kib(pid: int) -> int:
    """The resident set of a process in KiB (Linux /proc; 0 elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time a process has used so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_env(env: dict[str, str], src: str | None) -> dict[str, str]:
    """The environment of a process run from another source tree (its ``src`` folder), or ``env``."""
    return env if src is None else {**env, "PYTHONPATH": str(Path(src).resolve())}


def call_line(request_id: int, tool: str = "echo") -> bytes:
    text = f"hello {request_id}"
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": tool, "arguments": {"message": text, "text": text}}}).encode() + b"\n"


def check_answer(line: bytes, request_id: int) -> None:
    """The answer to ``request_id``, a result and not a tool error (a cheap scan, then a parse on doubt)."""
    if b'"result"' in line and b'"isError":true' not in line:
        mark = f'"id":{request_id}'.encode()
        at = line.find(mark) + len(mark)
        if at >= len(mark) and line[at:at + 1] in (b",", b"}"):
            return
    message = json.loads(line)
    if message.get("id") != request_id or "result" not in message or message["result"].get("isError"):
        raise AssertionError(f"unexpected answer to {request_id}: {line[:300]!r}")


class RawStdioClient:
    """One child process spoken to over its pipes, one JSON line at a time."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.started = time.perf_counter()
        self.process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin.fileno()
        self._out = self.process.stdout.fileno()
        self._buffer = b""
        self.next_id = 10

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._in, view):]

    def line(self) -> bytes:
        """The next response line (notifications and requests from the server are skipped)."""
        while True:
            line = self._line()
            if b'"method":"' not in line or b'"result":' in line or b'"error":' in line:
                return line

    def _line(self) -> bytes:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line, self._buffer = self._buffer[:end], self._buffer[end + 1:]
                return line
            chunk = os.read(self._out, 1 << 16)
            if not chunk:
                raise EOFError("the process closed its output")
            self._buffer += chunk

    def initialize(self) -> float:
        """Initialize and list tools; the seconds from spawn to the initialize answer."""
        self.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                              "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                                         "clientInfo": {"name": "bench", "version": "1"}}}).encode() + b"\n")
        self.line()
        spawn = time.perf_counter() - self.started
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.send(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n')
        self.line()
        return spawn

    def call(self) -> float:
        """One tools/call, answered; its latency in ms."""
        request_id = self.next_id
        self.next_id += 1
        data = call_line(request_id)
        start = time.perf_counter()
        self.send(data)
        answer = self.line()
        elapsed = (time.perf_counter() - start) * 1000
        check_answer(answer, request_id)
        return elapsed

    def pipelined(self, calls: int, inflight: int) -> float:
        """``calls`` calls with ``inflight`` outstanding at a time; calls per second."""
        first = self.next_id
        self.next_id += calls
        lines = [call_line(first + i) for i in range(calls)]
        start = time.perf_counter()
        sent = received = 0
        while received < calls:
            while sent < calls and sent - received < inflight:
                self.send(lines[sent])
                sent += 1
            answer = self.line()
            received += 1
            if b'"isError":true' in answer or b'"result"' not in answer:
                raise AssertionError(f"unexpected answer: {answer[:300]!r}")
        return calls / (time.perf_counter() - start)

    def idle(self, seconds: float) -> None:
        """Wait without a call (what the process writes meanwhile is read with the next answer)."""
        time.sleep(seconds)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
