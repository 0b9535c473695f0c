"""The ``rate_limits`` section of serve's configuration: token buckets per agent and per agent and tool.

Invariant: a bucket that loads has a positive, finite rate (calls per second, refilled continuously)
and a burst of at least one call (the bucket's size, and how many calls an idle agent may make at
once), and the time it takes to refill whole (``burst / rate`` seconds) is a finite number: a rate so
small that one call's wait is not (``1e-320``) would only fail at the first refusal. A section that
names neither bucket is refused rather than read as "no limit".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from drawbridge.config_reader import Reader


@dataclass(frozen=True)
class Bucket:
    rate: float
    """Calls per second the bucket refills."""
    burst: int
    """The bucket's size: calls allowed at once."""


@dataclass(frozen=True)
class RateLimits:
    per_agent: Bucket | None = None
    per_agent_tool: Bucket | None = None


def _bucket(section: Reader, key: str) -> Bucket | None:
    node = section.child(key)
    if node is None:
        return None
    node.check_keys({"rate", "burst"})
    rate = node.get("rate", float, required=True)
    if not (math.isfinite(rate) and rate > 0):
        raise node.fail("rate", f"{node.where}.rate must be a positive number of calls per second")
    burst = node.get("burst", int, default=max(1, math.ceil(rate)))
    if burst < 1:
        raise node.fail("burst", f"{node.where}.burst must be at least 1")
    try:
        refill = burst / rate
    except OverflowError:
        refill = math.inf
    if not math.isfinite(refill):
        raise node.fail(
            "rate",
            f"{node.where}: at this rate the bucket would take longer than any finite time to refill; give a larger rate",
        )
    return Bucket(rate, burst)


def rate_limits_section(top: Reader) -> RateLimits | None:
    """``rate_limits``: None when absent (no limit)."""
    section = top.child("rate_limits")
    if section is None:
        return None
    section.check_keys({"per_agent", "per_agent_tool"})
    limits = RateLimits(_bucket(section, "per_agent"), _bucket(section, "per_agent_tool"))
    if limits.per_agent is None and limits.per_agent_tool is None:
        raise section.fail(None, "rate_limits names no bucket: give per_agent, per_agent_tool or both")
    return limits


__all__ = ["Bucket", "RateLimits", "rate_limits_section"]
