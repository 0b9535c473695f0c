"""``drawbridge serve``'s listeners against peers that connect and do not send: partial headers, a body
announced and trickled, and more connections than the listener holds (``limits.header_read_seconds``,
``limits.body_read_seconds``, ``limits.max_connections``).

A real gateway process serves each test; the peers are raw sockets. The deadlines configured are short
(scaled) and every wait is bounded by a scaled timeout: a connection the gateway never closes fails
the test by that timeout, not by a measured duration.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from conftest import eventually, scaled
from serve_support import GITHUB, Running, http_gateway, write_config

DEADLINE_SECONDS = scaled(1.0)
"""The read deadlines of the gateway under test."""
WAIT_SECONDS = scaled(30.0)
"""How long a test waits for the gateway to answer or close a connection."""


def _port(url: str | None) -> int:
    assert url is not None
    return httpx.URL(url).port or 0


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_SECONDS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection (a timeout fails the test)."""
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    limits = {"header_read_seconds": DEADLINE_SECONDS, "body_read_seconds": DEADLINE_SECONDS}
    config = write_config(tmp_path_factory.mktemp("slow"), [GITHUB], auth={"anonymous_agent": "guest"}, limits=limits)
    with http_gateway(config) as running:
        running.control()
        yield running


@pytest.mark.parametrize("listener", ["mcp", "control"])
@pytest.mark.parametrize("sent", [b"", b"POST /mcp HTTP/1.1\r\n", b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"])
def test_a_peer_that_does_not_finish_its_headers_is_answered_408_and_closed(
    gateway: Running, listener: str, sent: bytes
) -> None:
    port = _port(gateway.url if listener == "mcp" else gateway.control_url)
    with _connect(port) as sock:
        sock.sendall(sent)
        answer = _until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_body_announced_and_trickled_is_answered_408_and_closed(gateway: Running) -> None:
    """The body deadline runs from the headers: a byte now and then does not extend it."""
    port = _port(gateway.url)
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nContent-Length: 4096\r\n\r\n{"
    ).encode()
    closed = threading.Event()
    with _connect(port) as sock:
        sock.sendall(head)

        def trickle() -> None:
            while not closed.wait(DEADLINE_SECONDS / 10):
                try:
                    sock.sendall(b" ")
                except OSError:
                    return

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        try:
            answer = _until_closed(sock)
        finally:
            closed.set()
            thread.join(WAIT_SECONDS)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_request_sent_in_time_is_answered_and_the_connection_kept(gateway: Running) -> None:
    """The deadlines bound the reading only: a whole request is served, twice on one connection."""
    base = gateway.url.removesuffix("/mcp") if gateway.url else ""
    with httpx.Client(timeout=WAIT_SECONDS) as client:
        assert client.get(base + "/healthz").status_code == 200
        assert client.get(base + "/readyz").status_code == 200


def test_connections_beyond_the_cap_are_answered_503_until_one_ends(tmp_path) -> None:
    limits = {"max_connections": 3, "header_read_seconds": WAIT_SECONDS}
    config = write_config(tmp_path, [GITHUB], auth={"anonymous_agent": "guest"}, limits=limits)
    with http_gateway(config) as running:
        port = _port(running.url)
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
        held = [_connect(port) for _ in range(3)]
        try:
            with _connect(port) as extra:
                extra.sendall(request)
                answer = _until_closed(extra)
            assert answer.startswith(b"HTTP/1.1 503 ") and b"limits.max_connections" in answer, answer
            assert running.wait_until(lambda text: "limits.max_connections (3)" in text, WAIT_SECONDS)
        finally:
            for sock in held:
                sock.close()

        def served() -> bool:
            with _connect(port) as sock:
                sock.sendall(request)
                return _until_closed(sock).startswith(b"HTTP/1.1 200 ")

        eventually(served, WAIT_SECONDS, "a connection served once the held ones ended")
