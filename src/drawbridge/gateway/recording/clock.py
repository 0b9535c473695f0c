"""The recorder's clock: UTC now as every evidence record writes it.

Invariant: ``utc_now`` returns ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (RFC 3339, UTC, microseconds), the
form the trace's ``at`` requires; each whole second is formatted once and replaced whole, so threads
never see a mix of two seconds.
"""

from __future__ import annotations

import time

_last_second: tuple[int, str] = (-1, "")
"""The last whole second formatted, with its text."""


def utc_now() -> str:
    """``datetime.now(UTC)`` as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, formatting each second once."""
    global _last_second
    second, micro = divmod(time.time_ns() // 1000, 1_000_000)
    last = _last_second
    if last[0] != second:
        last = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        _last_second = last
    return f"{last[1]}.{micro:06d}Z"


__all__ = ["utc_now"]
