"""What the telemetry worker reads of a collector's answers: the status and headers, and a body only
as long as a real OTLP answer (``MAX_ANSWER_BYTES``).

Invariant: a collector's answer costs the worker at most ``MAX_ANSWER_BYTES`` of memory and no time
past the export's own timeout. The OTLP/HTTP exporters read only an answer's status and headers
(``Retry-After``), yet the HTTP client they are given reads every body whole, at whatever length the
collector declares (a ``Content-Length`` of 3 GiB grew the worker by gigabytes and held the export
past its timeout, one read at a time). So the exporters get ``BoundedSession``: a body is read only
when it declares a length within the bound, and only until the export's timeout; any other is left
unread and its connection closed (the next export opens another). Over gRPC the channel refuses an
answer larger than the same bound (``GRPC_OPTIONS``).
"""

from __future__ import annotations

import time
from typing import Any, Final

import requests

MAX_ANSWER_BYTES: Final = 64 * 1024
"""An ``Export*ServiceResponse`` is a few bytes (a partial success: a count and a message)."""
GRPC_OPTIONS: Final = (("grpc.max_receive_message_length", MAX_ANSWER_BYTES),)


class BoundedSession(requests.Session):
    """A ``requests`` session whose answers hold at most ``MAX_ANSWER_BYTES`` of body (module docstring)."""

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["stream"] = True  # the headers only; the body is read below, if at all
        timeout = kwargs.get("timeout")
        response = super().request(method, url, *args, **kwargs)
        deadline = time.monotonic() + (timeout if isinstance(timeout, (int, float)) else 10.0)
        body = _bounded_body(response, deadline)
        response._content = body or b""  # what the exporter may read; never the stream again
        response._content_consumed = body is not None  # an unread rest: close() drops the connection
        response.close()
        return response


def _bounded_body(response: requests.Response, deadline: float) -> bytes | None:
    """The whole body when it declares a length within the bound and arrives before ``deadline``;
    None when it is left (partly) unread."""
    declared = response.headers.get("Content-Length", "")
    if not declared.isdigit() or int(declared) > MAX_ANSWER_BYTES:
        return None
    wanted, parts = int(declared), []
    while wanted > 0 and time.monotonic() < deadline:
        try:
            part = response.raw.read1(wanted, decode_content=False)
        except Exception:  # noqa: BLE001 -- a broken answer is an unread one
            return None
        if not part:
            break
        parts.append(part)
        wanted -= len(part)
    return b"".join(parts) if wanted == 0 else None


__all__ = ["GRPC_OPTIONS", "MAX_ANSWER_BYTES", "BoundedSession"]
