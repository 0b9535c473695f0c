"""The arguments of the approvals pending in this process, as a person is shown them, in memory only.

Invariant: what is held here never reaches a disk, a record, a log line or an error message, and
lives no longer than the process: after a restart nothing is left to show (the approvals that were
pending are expired at the next start, ``resolutions.recover_after_restart``). What is held is
already what a person is shown (``approval.shown_arguments``: secret-like values masked, long values
cut), never the raw arguments. At most ``MAX_HELD`` approvals are held, the oldest let go first, and
an approval's entry is let go as soon as it ends in this process (``Resolutions`` releases it with
every resolution and expiry it makes or observes) or is found ended by the sweep (another gateway
on the same state file resolved it).

Theory of operation. The engine holds the arguments of the call that opened (or joined) the open
question for an approval, once the approval is in the store; identical waiting calls share one
approval and, by its digest, the same arguments, so the first holding stands. The control plane
reads them through ``ApprovalEngine.shown_arguments`` and shows them only while the approval is
pending.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any, Final

from drawbridge.approval.shown_arguments import ShownArguments, show_arguments

MAX_HELD: Final = 512
"""Approvals whose arguments are held at once (each within ``approval.shown_arguments``' bounds)."""


class HeldArguments:
    """Approval id -> the ``ShownArguments`` of its call, bounded (module docstring)."""

    def __init__(self, max_held: int = MAX_HELD) -> None:
        if max_held < 1:
            raise ValueError("max_held must be positive")
        self._max = max_held
        self._held: OrderedDict[str, ShownArguments] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, approval_id: str, arguments: Mapping[str, Any]) -> None:
        """Keep what a person is shown of ``arguments`` for ``approval_id`` (the first holding stands)."""
        if approval_id in self._held:
            return
        self._held[approval_id] = show_arguments(arguments)
        while len(self._held) > self._max:
            self._held.popitem(last=False)

    def shown(self, approval_id: str) -> ShownArguments | None:
        return self._held.get(approval_id)

    def release(self, approval_id: str) -> None:
        self._held.pop(approval_id, None)

    def ids(self) -> frozenset[str]:
        return frozenset(self._held)

    def release_ended(self, held_before: Collection[str], pending: Collection[str]) -> None:
        """Let go of the ids held before the store was read (``held_before``) that it no longer has
        pending: an approval that ended never becomes pending again, so none of them is still open."""
        for approval_id in held_before:
            if approval_id not in pending:
                self.release(approval_id)


__all__ = ["MAX_HELD", "HeldArguments"]
