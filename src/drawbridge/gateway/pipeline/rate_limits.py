"""Rate limits: a token bucket per agent and one per agent and tool, checked before a call is decided.

Invariant: a call goes on only when every bucket configured for it holds a whole token, and then
takes one from each; otherwise it is refused, before any decision, as "rate limited" with the
seconds after which a retry will find a token, and the refusal is recorded like every refusal. A
bucket refills at ``rate`` tokens per second up to ``burst``. When the buckets cannot be read (the
shared database is away) the call is refused as state unavailable: a limit that cannot be checked
is not lifted.

Theory of operation. ``LocalBuckets`` holds the buckets of this process in memory (SQLite: one
gateway, one machine). ``SharedBuckets`` holds them in PostgreSQL's ``rate_buckets``, so every
replica draws from the same bucket: each check is one short transaction that creates the bucket
full if it is new, locks its row (``FOR UPDATE``: only callers of the same bucket wait for each
other), refills it by the database's clock and takes the tokens. Of an agent's two buckets, a call
refused by the second gives back nothing it did not take: buckets are checked first, then taken,
in one transaction.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from drawbridge.config_rates import Bucket, RateLimits
from drawbridge.gateway.pipeline.deciders import STATE_UNAVAILABLE
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import GATEWAY_POLICY, Action, Provenance, Verdict
from drawbridge.state.postgres import PostgresDB
from drawbridge.state.sqlite import StateUnavailable

RATE_LIMITED: Final = "rate limited: {what} allows {rate:g} calls per second (burst {burst}); retry after {wait:.2f} s"

Key = tuple[str, Bucket, str]
"""A bucket's storage key, its configuration, and what it limits (for the refusal's wording)."""


def _keys(limits: RateLimits, call: ToolCall) -> list[Key]:
    keys: list[Key] = []
    if limits.per_agent is not None:
        keys.append((f"agent\x1f{call.agent}", limits.per_agent, f"agent {call.agent}"))
    if limits.per_agent_tool is not None:
        keys.append((f"tool\x1f{call.agent}\x1f{call.tool}", limits.per_agent_tool, f"agent {call.agent} on {call.tool}"))
    return keys


def _refill(tokens: float, elapsed: float, bucket: Bucket) -> float:
    return min(float(bucket.burst), tokens + max(0.0, elapsed) * bucket.rate)


def _take(levels: Sequence[tuple[float, Key]]) -> tuple[list[float], Key | None, float]:
    """The levels after taking one token from each, or the first bucket short of a token and the wait."""
    for level, key in levels:
        if level < 1.0:
            return [level for level, _ in levels], key, (1.0 - level) / key[1].rate
    return [level - 1.0 for level, _ in levels], None, 0.0


class Buckets(Protocol):
    async def take(self, keys: Sequence[Key]) -> tuple[Key, float] | None:
        """None when a token was taken from every bucket; else the bucket short of one and the wait."""
        ...


class LocalBuckets:
    """The buckets of this process (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._levels: dict[str, tuple[float, float]] = {}

    async def take(self, keys: Sequence[Key]) -> tuple[Key, float] | None:
        now = self._clock()
        levels = []
        for key in keys:
            tokens, at = self._levels.get(key[0], (float(key[1].burst), now))
            levels.append((_refill(tokens, now - at, key[1]), key))
        after, short, wait = _take(levels)
        for (_, key), level in zip(levels, after, strict=True):
            self._levels[key[0]] = (level, now)
        return None if short is None else (short, wait)


class SharedBuckets:
    """The buckets in the shared database (module docstring)."""

    def __init__(self, db: PostgresDB) -> None:
        self._db = db

    async def take(self, keys: Sequence[Key]) -> tuple[Key, float] | None:
        def transact(conn: Any) -> tuple[Key, float] | None:
            levels = []
            for key in sorted(keys, key=lambda k: k[0]):  # one lock order: no deadlock between replicas
                conn.execute(
                    "INSERT INTO rate_buckets (bucket, tokens, updated_at) "
                    "VALUES (?, ?, extract(epoch FROM clock_timestamp())) ON CONFLICT DO NOTHING",
                    (key[0], float(key[1].burst)),
                )
                tokens, at, now = conn.execute(
                    "SELECT tokens, updated_at, extract(epoch FROM clock_timestamp())::float8 FROM rate_buckets "
                    "WHERE bucket = ? FOR UPDATE",
                    (key[0],),
                ).fetchone()
                levels.append((_refill(tokens, now - at, key[1]), key, now))
            after, short, wait = _take([(level, key) for level, key, _ in levels])
            for (_, key, now), level in zip(levels, after, strict=True):
                conn.execute(
                    "UPDATE rate_buckets SET tokens = ?, updated_at = ? WHERE bucket = ?", (level, now, key[0])
                )
            return None if short is None else (short, wait)

        return await self._db.transact(transact, "take rate-limit tokens")


MAX_RETRY_SECONDS: Final = 1e9
"""The longest wait a refusal names (about 32 years): a wait beyond it says as much without its digits."""


def _retry_seconds(wait: float) -> float:
    """The wait a refusal names: rounded up to the hundredth, and never more than ``MAX_RETRY_SECONDS``
    (a rate near zero makes the exact wait too large to round, or infinite)."""
    if not wait < MAX_RETRY_SECONDS:  # also NaN
        return MAX_RETRY_SECONDS
    return math.ceil(wait * 100) / 100


class RateLimiter:
    """The check the pipeline makes before deciding a call (module docstring)."""

    def __init__(self, limits: RateLimits, buckets: Buckets) -> None:
        self._limits = limits
        self._buckets = buckets

    async def check(self, call: ToolCall) -> Verdict | None:
        """None when the call may go on; else the refusal (rate limited, or state unavailable)."""
        keys = _keys(self._limits, call)
        try:
            short = await self._buckets.take(keys)
        except StateUnavailable:
            return Verdict(Action.DENY, STATE_UNAVAILABLE, Provenance(GATEWAY_POLICY))
        if short is None:
            return None
        (_, bucket, what), wait = short
        wait = _retry_seconds(wait)
        reason = RATE_LIMITED.format(what=what, rate=bucket.rate, burst=bucket.burst, wait=wait)
        return Verdict(Action.DENY, reason, Provenance(GATEWAY_POLICY))


def rate_limiter(limits: RateLimits | None, db: object) -> RateLimiter | None:
    """Shared buckets on PostgreSQL, this process's otherwise; None without limits."""
    if limits is None:
        return None
    return RateLimiter(limits, SharedBuckets(db) if isinstance(db, PostgresDB) else LocalBuckets())


__all__ = ["RATE_LIMITED", "LocalBuckets", "RateLimiter", "SharedBuckets", "rate_limiter"]
