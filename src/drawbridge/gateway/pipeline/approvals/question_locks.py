"""One open question per call: identical calls arriving together share it instead of each opening one.

Invariant: within one process, finding the open approval for a call (``ApprovalUses.find_pending``)
and opening a new one when there is none (``ApprovalStore.submit``, its record, its notice) are one
step for each call binding -- agent, tool, keyed argument digest and who may answer. Of N identical
calls that arrive together the first opens the question; the others wait on its lock and then find
it, so the person is asked once and each webhook gets one notice. One approval still lets one call
through (``state.approval_uses``): when it is approved one waiter runs and the others, finding the
approval used, ask again -- again under the lock, so they share the next question.

Across processes nothing more is held than before: replicas on PostgreSQL (or processes on one
SQLite file) each take their own locks, so two replicas that receive the same call at the same
moment can each open a question (``find_pending`` sees only committed rows); each replica's own
waiters still share the one it opened, and the use ledger still lets one approval run one call.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Hashable

import anyio


class QuestionLocks:
    """A lock per call binding, kept only while some call holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[anyio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def held(self, binding: Hashable) -> AsyncIterator[None]:
        """Hold the lock of ``binding`` for the block (waiting for the call that holds it)."""
        lock, users = self._locks.get(binding) or (anyio.Lock(), 0)
        self._locks[binding] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[binding]
            if users == 1:
                del self._locks[binding]
            else:
                self._locks[binding] = (lock, users - 1)


__all__ = ["QuestionLocks"]
