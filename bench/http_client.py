"""A raw MCP client over streamable HTTP: one kept-alive HTTP/1.1 connection per session (http.client,
TCP_NODELAY on), JSON or SSE answers read whole and checked.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

from raw_client import PROTOCOL, call_line, check_answer

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def _message(body: bytes, content_type: str) -> bytes:
    """The JSON-RPC message of an answer: the body itself, or the data of its SSE event."""
    if not content_type.startswith("text/event-stream"):
        return body
    for line in body.splitlines():
        if line.startswith(b"data:") and line[5:].strip():
            return line[5:].strip()
    raise AssertionError(f"no message in the event stream: {body[:300]!r}")


class HttpSession:
    def __init__(self, url: str, tool: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        self.path = parts.path
        self.tool = tool
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.headers = {**HEADERS, **(headers or {})}
        self.next_id = 10

    def post(self, body: bytes) -> bytes | None:
        self.connection.request("POST", self.path, body=body, headers=self.headers)
        response = self.connection.getresponse()
        data = response.read()
        if response.status == 202:
            return None
        assert response.status == 200, (response.status, data[:300])
        session = response.getheader("mcp-session-id")
        if session:
            self.headers["mcp-session-id"] = session
        return _message(data, response.getheader("content-type", ""))

    def initialize(self) -> None:
        self.post(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                              "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                                         "clientInfo": {"name": "bench", "version": "1"}}}).encode())
        self.headers["mcp-protocol-version"] = PROTOCOL
        self.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def call(self) -> float:
        request_id = self.next_id
        self.next_id += 1
        body = call_line(request_id, self.tool)
        start = time.perf_counter()
        answer = self.post(body)
        elapsed = (time.perf_counter() - start) * 1000
        assert answer is not None
        check_answer(answer, request_id)
        return elapsed

    def close(self) -> None:
        if "mcp-session-id" in self.headers:
            self.connection.request("DELETE", self.path, headers=self.headers)
            self.connection.getresponse().read()
        self.connection.close()


def concurrent_rate(url: str, tool: str, sessions: int, calls: int, headers: dict[str, str] | None = None) -> float:
    """``calls`` calls spread over ``sessions`` sessions calling at once (a thread each); calls/s."""
    opened = [HttpSession(url, tool, headers) for _ in range(sessions)]
    for session in opened:
        session.initialize()
    per_session = calls // sessions
    barrier = threading.Barrier(sessions + 1)
    errors: list[BaseException] = []

    def work(session: HttpSession) -> None:
        barrier.wait()
        try:
            for _ in range(per_session):
                session.call()
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(session,)) for session in opened]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    rate = per_session * sessions / (time.perf_counter() - start)
    for session in opened:
        session.close()
    if errors:
        raise errors[0]
    return rate
