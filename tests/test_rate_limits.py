"""Rate limits: token buckets per agent and per agent and tool, local on SQLite and shared on PostgreSQL.

The shared buckets run on a real PostgreSQL; the end-to-end tests run real ``drawbridge serve``
processes (two replicas on one database, or one gateway on its SQLite file) with mcp SDK clients.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from approval_support import decisions, text_of
from replica_support import CALL_TIMEOUT, KEY_ENV, recording_upstream, replica_config
from serve_support import http_client, http_gateway, write_config

from drawbridge.config_rates import Bucket, RateLimits
from drawbridge.gateway.pipeline.deciders import STATE_UNAVAILABLE
from drawbridge.gateway.pipeline.rate_limits import LocalBuckets, RateLimiter, SharedBuckets
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.policy.model import Action
from drawbridge.state.postgres import PostgresDB

pytestmark = pytest.mark.anyio

SLOW = Bucket(rate=0.5, burst=2)
"""Two calls at once, then one every two seconds: a test never waits for a refill."""


def call(agent: str = "guest", tool: str = "rec.safe_read") -> ToolCall:
    return ToolCall(agent=agent, tool=tool, arguments={}, meta=None, request_id=1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_local_bucket_allows_its_burst_then_says_when_to_retry_and_refills() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(per_agent=SLOW), LocalBuckets(clock))
    assert await limiter.check(call()) is None and await limiter.check(call()) is None
    refused = await limiter.check(call())
    assert refused is not None and refused.action is Action.DENY
    assert refused.reason.startswith("rate limited: agent guest allows 0.5 calls per second (burst 2)")
    assert refused.reason.endswith("retry after 2.00 s")
    assert await limiter.check(call(agent="other")) is None  # one bucket per agent
    clock.now += 2.0
    assert await limiter.check(call()) is None


async def test_a_rate_near_zero_names_a_wait_it_can_compute() -> None:
    """One call's wait at 1e-307 calls per second is finite, but a hundred times it is not: the refusal
    still names a wait (capped), never fails the decision."""
    limiter = RateLimiter(RateLimits(per_agent=Bucket(rate=1e-307, burst=1)), LocalBuckets(FakeClock()))
    assert await limiter.check(call()) is None
    refused = await limiter.check(call())
    assert refused is not None and refused.action is Action.DENY
    assert refused.reason.endswith("retry after 1000000000.00 s")


async def test_a_call_refused_by_its_tool_bucket_takes_nothing_from_its_agent_bucket() -> None:
    limiter = RateLimiter(
        RateLimits(per_agent=Bucket(rate=0.5, burst=3), per_agent_tool=Bucket(rate=0.5, burst=1)), LocalBuckets(FakeClock())
    )
    assert await limiter.check(call(tool="a")) is None
    refused = await limiter.check(call(tool="a"))
    assert refused is not None and "agent guest on a allows" in refused.reason
    assert await limiter.check(call(tool="b")) is None  # the agent bucket still held a token for b
    assert await limiter.check(call(tool="c")) is None
    last = await limiter.check(call(tool="d"))
    assert last is not None and "agent guest allows" in last.reason


async def test_shared_buckets_are_one_bucket_for_every_replica(postgres_url: str) -> None:
    a, b = PostgresDB.open(postgres_url), PostgresDB.open(postgres_url)
    try:
        limits = RateLimits(per_agent_tool=SLOW)
        on_a, on_b = RateLimiter(limits, SharedBuckets(a)), RateLimiter(limits, SharedBuckets(b))
        results = []

        async def check(limiter: RateLimiter) -> None:
            results.append(await limiter.check(call()))

        async with anyio.create_task_group() as tg:
            for limiter in (on_a, on_b, on_a, on_b):
                tg.start_soon(check, limiter)
        refused = [r for r in results if r is not None]
        assert len(refused) == 2 and all("retry after" in r.reason for r in refused)
    finally:
        a.close()
    b.close()
    refused_closed = await on_b.check(call())
    assert refused_closed is not None and refused_closed.reason == STATE_UNAVAILABLE


async def test_two_replicas_share_the_bucket_and_the_refusal_is_recorded(tmp_path: Path, postgres_url: str) -> None:
    log = tmp_path / "calls.log"
    limits = {"per_agent": {"rate": 0.5, "burst": 2}}
    config_a = replica_config(tmp_path, "a", postgres_url, log, rate_limits=limits)
    config_b = replica_config(tmp_path, "b", postgres_url, log, rate_limits=limits)
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        assert a.url is not None and b.url is not None
        async with http_client(a.url) as on_a, http_client(b.url) as on_b:
            with anyio.fail_after(CALL_TIMEOUT):
                assert text_of(await on_a.call_tool("rec.safe_read", {})) == "ran safe_read"
                assert text_of(await on_b.call_tool("rec.safe_read", {})) == "ran safe_read"
                refused = await on_a.call_tool("rec.safe_read", {})
    assert refused.is_error and "rate limited" in text_of(refused) and "retry after" in text_of(refused)
    (recorded,) = [d for d in decisions(tmp_path / "a" / "evidence") if "rate limited" in str(d)]
    assert recorded["tool"] == "rec.safe_read"


async def test_a_single_gateway_on_sqlite_limits_with_its_own_buckets(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, [recording_upstream(tmp_path / "calls.log")], policies={
            "p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"
        },
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"}, rate_limits={"per_agent_tool": {"rate": 0.5, "burst": 1}},
    )
    with http_gateway(config) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            with anyio.fail_after(CALL_TIMEOUT):
                assert not (await client.call_tool("rec.safe_read", {})).is_error
                limited = await client.call_tool("rec.safe_read", {})
                other_tool = await client.call_tool("rec.delete_all", {})
    assert limited.is_error and "rate limited: agent guest on rec.safe_read" in text_of(limited)
    assert not other_tool.is_error
