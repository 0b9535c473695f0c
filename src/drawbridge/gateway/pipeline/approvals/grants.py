"""Creating, listing and revoking temporal grants, each change recorded in the trace chain.

Invariant: every grant that exists was recorded as ``grant_created`` and every
revocation as ``grant_revoked``, by whoever made the change through this
service (control plane, CLI, console). A grant only ever lifts
``human_approval`` to ``allow`` (``drawbridge.state.grants.lift``); this
service does not change that, it only makes grants with a checked duration.

Theory of operation. Durations are typed by people (``30m``, ``2h``) and go
through ``parse_duration`` with the store's upper bound, so a typo is a
precise error and not a grant of the wrong length. The store write happens
first; the trace record second. If the record cannot be written the change
is undone where it can be (a new grant is revoked again, by
``system:trace-failure``) and the error is raised: a grant that is not in the
chain must not lift anything.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from drawbridge.approval.durations import parse_duration
from drawbridge.policy.globs import compile_glob
from drawbridge.state.grants import DEFAULT_MAX_DURATION, Grant, GrantStore

logger = logging.getLogger("drawbridge.approval")

TRACE_GRANT_CREATED: Final = "grant_created"
TRACE_GRANT_REVOKED: Final = "grant_revoked"
REVOKED_BY_TRACE_FAILURE: Final = "system:trace-failure"

TraceAppend = Callable[[str, Mapping[str, Any]], Awaitable[Any]]
Clock = Callable[[], datetime]


def utc_clock() -> datetime:
    return datetime.now(UTC)


class GrantService:
    """Grants as the control plane, the CLI and the console use them."""

    def __init__(
        self,
        grants: GrantStore,
        trace_append: TraceAppend,
        *,
        clock: Clock = utc_clock,
        max_duration: timedelta = DEFAULT_MAX_DURATION,
    ) -> None:
        self._grants = grants
        self._trace = trace_append
        self._clock = clock
        self._max = max_duration

    @property
    def store(self) -> GrantStore:
        return self._grants

    async def create(
        self, *, agent: str, tools: str, duration: str | timedelta, granted_by: str
    ) -> Grant:
        """Grant ``agent`` (glob) the ``tools`` (glob) for ``duration``; raises ValueError on bad input."""
        length = (
            parse_duration(duration, maximum=self._max) if isinstance(duration, str) else duration
        )
        if not isinstance(length, timedelta) or length <= timedelta(0):
            raise ValueError("a grant duration must be positive")
        now = self._clock()
        grant = await self._grants.create(agent, tools, now + length, granted_by, created_at=now)
        try:
            await self._trace(TRACE_GRANT_CREATED, grant.created_record())
        except BaseException:
            logger.error("grant %s could not be recorded; revoking it", grant.id)
            try:
                await self._grants.revoke(grant.id, revoked_by=REVOKED_BY_TRACE_FAILURE, at=self._clock())
            except Exception:  # noqa: BLE001 -- the original failure is the one to report
                logger.error("grant %s could not be revoked after the trace failure", grant.id)
            raise
        return grant

    async def revoke(self, id_or_prefix: str, *, revoked_by: str) -> Grant:
        """Revoke by id or unique prefix; the revocation is recorded."""
        grant = await self._grants.revoke(id_or_prefix, revoked_by=revoked_by, at=self._clock())
        await self._trace(TRACE_GRANT_REVOKED, grant.revoked_record())
        return grant

    async def list(self, *, active_only: bool = True) -> list[Grant]:
        """Grants in force now (default), or every grant ever made, in creation order."""
        return await self._grants.list(active_at=self._clock() if active_only else None)

    async def active_for_agent(self, agent: str) -> list[Grant]:
        """Grants in force now whose agent glob matches ``agent`` (what an approval view shows)."""
        matching = []
        for grant in await self.list(active_only=True):
            try:
                if compile_glob(grant.agent_glob).matches(agent):
                    matching.append(grant)
            except ValueError:
                continue
        return matching


__all__ = [
    "TRACE_GRANT_CREATED",
    "TRACE_GRANT_REVOKED",
    "GrantService",
]
