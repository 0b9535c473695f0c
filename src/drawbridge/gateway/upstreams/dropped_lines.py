"""What the gateway says of a line from an upstream that it drops, and how often it logs it.

Invariant: every dropped line is recorded (the trace holds one incident per line: ``upstream_oversize``,
``upstream_garbage``, ``unknown_response``), and each record names the upstream and the rule the line
broke, never its content: a size, a parse error's words, at most the first ``SHOWN_ID_CHARS``
characters of a response's id. The log says the same, but an upstream that floods the gateway with
such lines cannot flood the log: at most ``LOG_BURST`` of them are logged per ``LOG_WINDOW_SECONDS``,
and the next drop after a window in which some were left out logs how many first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from drawbridge.gateway.protocol.jsonrpc import Oversize, RequestId

logger = logging.getLogger("drawbridge.gateway.upstream")

LOG_BURST: Final = 5
LOG_WINDOW_SECONDS: Final = 60.0
SHOWN_ID_CHARS: Final = 64


def oversize_detail(upstream: str, item: Oversize) -> str:
    return (
        f"a line of at least {item.size} bytes from upstream {upstream!r} exceeds the limit of "
        f"{item.limit} bytes; it was dropped"
    )


def garbage_detail(upstream: str, problem: str) -> str:
    return f"a line from upstream {upstream!r} was dropped: {problem}"


def unknown_response_detail(upstream: str, request_id: RequestId | None, *, sent: bool) -> str:
    shown = request_id
    if isinstance(request_id, str) and len(request_id) > SHOWN_ID_CHARS:
        shown = request_id[:SHOWN_ID_CHARS] + "..."
    why = "is no longer in flight (answered already, or given up)" if sent else "the gateway never sent"
    return f"a response from upstream {upstream!r} for id {shown!r}, which {why}, was dropped"


def answer_dropped(method: str, detail: str) -> str:
    """The error a request is answered with when its answer was a line that had to be dropped."""
    return f"the upstream's answer to {method} could not be passed on: {detail}"


class LogBudget:
    """How many dropped lines of one upstream may still be logged now (module docstring)."""

    def __init__(self, upstream: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._upstream = upstream
        self._clock = clock
        self._window_start = -LOG_WINDOW_SECONDS
        self._logged = 0
        self._left_out = 0

    def allows(self) -> bool:
        """Whether the next dropped line is logged (it is recorded either way)."""
        now = self._clock()
        if now - self._window_start >= LOG_WINDOW_SECONDS:
            if self._left_out:
                logger.warning(
                    "upstream %r: %d more dropped line(s) were not logged (each is recorded in the trace)",
                    self._upstream, self._left_out,
                )
            self._window_start, self._logged, self._left_out = now, 0, 0
        if self._logged < LOG_BURST:
            self._logged += 1
            return True
        self._left_out += 1
        return False


__all__ = [
    "LOG_BURST",
    "LOG_WINDOW_SECONDS",
    "LogBudget",
    "answer_dropped",
    "garbage_detail",
    "oversize_detail",
    "unknown_response_detail",
]
