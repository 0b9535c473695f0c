"""Temporal grants: persisted, glob-matched like policy, expiring, revocable, and never lifting deny.

The store's tests run on both backends (``state``: a SQLite file, a real PostgreSQL database)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.approval.durations import parse_duration
from drawbridge.gateway.pipeline.verdicts import Action as PipelineAction
from drawbridge.policy.model import Action, stricter
from drawbridge.state.grants import (
    AmbiguousGrantId,
    Grant,
    GrantAlreadyRevoked,
    GrantNotFound,
    InvalidGrant,
    SqliteGrantStore,
    lift,
)
from drawbridge.state.backend import StateBackend, open_backend

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def open_store(
    path: Path | str, ids: Iterator[str] | None = None, **kwargs: object
) -> tuple[StateBackend, SqliteGrantStore]:
    db = open_backend(str(path))
    if ids is not None:
        kwargs["id_source"] = lambda: next(ids)
    return db, SqliteGrantStore(db, **kwargs)  # type: ignore[arg-type]


async def test_create_match_expire_and_persist(state: str) -> None:
    path = state
    db, store = open_store(path, iter(["1111aaaa00000000"]))
    grant = await store.create("ci-*", "github.*", T0 + parse_duration("30m"), "cli:alice", created_at=T0)
    assert grant.id == "1111aaaa00000000"
    assert grant.created_record() == {
        "grant_id": "1111aaaa00000000",
        "agent": "ci-*",
        "tools": "github.*",
        "granted_by": "cli:alice",
        "created_at": "2026-05-01T12:00:00.000000Z",
        "expires_at": "2026-05-01T12:30:00.000000Z",
        "duration": "30m",
    }
    during = T0 + timedelta(minutes=10)
    # mesh7 glob semantics: "*" crosses dots, not slashes; anchored; case-sensitive.
    assert await store.active_for("ci-bot", "github.repos.list", during) == grant
    assert await store.active_for("ci-bot", "gitlab.repos.list", during) is None
    assert await store.active_for("cd-bot", "github.repos.list", during) is None
    assert await store.active_for("ci-bot", "GitHub.repos", during) is None
    assert await store.active_for("ci-bot/x", "github.a", during) is None
    assert grant.remaining(during) == timedelta(minutes=20)
    db.close()

    db, store = open_store(path)  # a restart neither loses nor extends the grant
    assert await store.active_for("ci-bot", "github.repos.list", during) == grant
    last_moment = T0 + timedelta(minutes=30) - timedelta(microseconds=1)
    assert await store.active_for("ci-bot", "github.repos.list", last_moment)
    assert await store.active_for("ci-bot", "github.repos.list", T0 + timedelta(minutes=30)) is None
    assert await store.list(active_at=T0 + timedelta(minutes=31)) == []
    assert await store.list() == [grant]  # history keeps it
    db.close()


async def test_first_grant_in_creation_order_wins(state: str) -> None:
    db, store = open_store(state, iter(["ffff000000000000", "0000ffff00000000"]))
    first = await store.create("*", "fs.*", T0 + timedelta(hours=1), "cli:a", created_at=T0)
    await store.create("ci-bot", "fs.write_file", T0 + timedelta(hours=2), "cli:b", created_at=T0)
    got = await store.active_for("ci-bot", "fs.write_file", T0)
    assert got is not None and got.id == first.id  # creation order, not id order
    db.close()


async def test_revoke_by_prefix_history_and_twice(state: str) -> None:
    db, store = open_store(state, iter(["abcd000000000000", "abcd111111111111"]))
    g1 = await store.create("ci-bot", "fs.*", T0 + timedelta(hours=1), "cli:a", created_at=T0)
    g2 = await store.create("ci-bot", "net.*", T0 + timedelta(hours=1), "cli:a", created_at=T0)
    with pytest.raises(AmbiguousGrantId):
        await store.revoke("abcd", revoked_by="cli:a", at=T0)
    with pytest.raises(GrantNotFound):
        await store.revoke("9999", revoked_by="cli:a", at=T0)
    revoked = await store.revoke("abcd0", revoked_by="console:bob", at=T0 + timedelta(minutes=5))
    assert revoked.id == g1.id and revoked.revoked_by == "console:bob"
    assert revoked.revoked_record() == {
        "grant_id": g1.id,
        "agent": "ci-bot",
        "tools": "fs.*",
        "revoked_by": "console:bob",
        "revoked_at": "2026-05-01T12:05:00.000000Z",
        "expires_at": "2026-05-01T13:00:00.000000Z",
    }
    assert await store.active_for("ci-bot", "fs.read", T0 + timedelta(minutes=6)) is None
    # Revocation applies from when it happened; it does not rewrite the past.
    assert [g.id for g in await store.list(active_at=T0 + timedelta(minutes=6))] == [g2.id]
    with pytest.raises(GrantAlreadyRevoked, match="already revoked by console:bob"):
        await store.revoke(g1.id, revoked_by="cli:a", at=T0 + timedelta(minutes=7))
    assert [g.id for g in await store.list()] == [g1.id, g2.id]
    db.close()


@pytest.mark.parametrize(
    ("agent", "tools", "minutes", "message"),
    [
        ("ci-[", "fs.*", 30, "agent glob is malformed"),
        ("ci-bot", "fs.[a-", 30, "tools glob is malformed"),
        ("", "fs.*", 30, "agent glob must be non-empty"),
        ("ci-bot", "fs.*", 0, "expire after it is created"),
        ("ci-bot", "fs.*", -5, "expire after it is created"),
        ("ci-bot", "fs.*", 24 * 60 + 1, "at most 24h, not 24h1m"),
    ],
)
async def test_create_refuses(state: str, agent: str, tools: str, minutes: int, message: str) -> None:
    db, store = open_store(state)
    with pytest.raises(InvalidGrant, match=message):
        await store.create(agent, tools, T0 + timedelta(minutes=minutes), "cli:a", created_at=T0)
    assert await store.list() == []
    db.close()


async def test_max_duration_is_configurable(state: str) -> None:
    db, store = open_store(state, max_duration=timedelta(hours=1))
    with pytest.raises(InvalidGrant, match="at most 1h"):
        await store.create("a", "b", T0 + timedelta(hours=2), "cli:a", created_at=T0)
    db.close()


# -- lift: grants turn human_approval into allow, nothing else -------------------------------------

GRANT = Grant("0" * 16, "*", "*", T0, T0 + timedelta(hours=1), "cli:a")


@pytest.mark.parametrize("enum", [Action, PipelineAction])
def test_lift_table(enum: type) -> None:
    table = {
        ("allow", True): "allow",
        ("human_approval", True): "allow",
        ("deny", True): "deny",
        ("allow", False): "allow",
        ("human_approval", False): "human_approval",
        ("deny", False): "deny",
    }
    for (action, with_grant), expected in table.items():
        result = lift(enum(action), GRANT if with_grant else None)
        assert result == enum(expected) and type(result) is enum


def test_lift_on_plain_strings_and_unknown_values() -> None:
    assert lift("human_approval", GRANT) == "allow"
    assert lift("deny", GRANT) == "deny"
    assert lift("rate_limited", GRANT) == "rate_limited"  # unknown: left for the caller to refuse


@given(st.sampled_from(list(Action)), st.booleans())
def test_lift_never_relaxes_deny_and_never_tightens(action: Action, with_grant: bool) -> None:
    lifted = lift(action, GRANT if with_grant else None)
    assert stricter(lifted, action) == action  # never stricter than before
    if action is Action.DENY:
        assert lifted is Action.DENY
    assert lift(lifted, GRANT if with_grant else None) == lifted  # idempotent


async def test_an_active_grant_does_not_lift_a_deny_end_to_end(state: str) -> None:
    db, store = open_store(state)
    await store.create("*", "*", T0 + timedelta(hours=1), "cli:a", created_at=T0)
    grant = await store.active_for("any-agent", "shell.exec", T0)
    assert grant is not None
    assert lift(Action.DENY, grant) is Action.DENY
    assert lift(Action.HUMAN_APPROVAL, grant) is Action.ALLOW
    db.close()
