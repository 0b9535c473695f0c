"""What the shadow policy would have decided, tallied for ``GET /shadow``: the calls where it agrees with
the enforced policy and those where it differs, per agent, tool and pair of actions.

Invariant: one count per recorded call (an observer of the ``EvidenceGuard``'s call records, so a call
a person approved, which the policies decide twice, counts once), read from ``Provenance.shadow`` only:
the tally holds names and actions, never an argument. Its table is bounded: past ``MAX_ROWS`` distinct
rows, further calls of new rows are counted in one overflow row, so an agent cannot grow it without end.
A record whose outcome is ``approval_pending`` (a non-blocking or 2026-07-28 approval answered "ask
again later") is not counted: the call is counted when its retry is recorded (``counted_shadow``, which
the metrics read too).
"""

from __future__ import annotations

from typing import Any, Final

from drawbridge.canonical import sanitize
from drawbridge.gateway.pipeline.deciders import Decider, PolicyDecider
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord
from drawbridge.gateway.pipeline.shadow import ShadowVerdict
from drawbridge.state.policy_store import PolicyStore

MAX_ROWS: Final = 4096

Row = tuple[str, str, str, str]
"""(agent, tool, the enforced policy's action, the shadow's action or ``failed``)."""


def counted_shadow(record: CallRecord) -> ShadowVerdict | None:
    """The shadow verdict a recorded call counts with, or None: no shadow decided it, or the record only
    says an approval is pending (the retry that follows is the call's record: one count per call)."""
    if record.provenance is None or record.outcome is Outcome.APPROVAL_PENDING:
        return None
    return record.provenance.shadow


class ShadowTally:
    """The shadow's verdicts of the recorded calls, counted (module docstring)."""

    def __init__(self, store: PolicyStore, max_rows: int = MAX_ROWS) -> None:
        self.store = store
        self.max_rows = max_rows
        self.rows: dict[Row, int] = {}
        self.calls = 0
        self.differing = 0
        self.overflow_calls = 0
        self.overflow_differing = 0

    def observe(self, record: CallRecord) -> None:
        """Count one recorded call the shadow decided beside the enforced policy (an observer)."""
        shadow = counted_shadow(record)
        if shadow is None:
            return
        differs = shadow.differs
        self.calls += 1
        self.differing += differs
        key = (record.agent, record.tool or "", shadow.policy_action.value, shadow.shown)
        if key in self.rows or len(self.rows) < self.max_rows:
            self.rows[key] = self.rows.get(key, 0) + 1
        else:
            self.overflow_calls += 1
            self.overflow_differing += differs

    def report(self) -> dict[str, Any]:
        """``GET /shadow``'s answer: the shadow set, the totals, and the rows, those that differ first."""
        store = self.store
        error = store.last_error
        rows = [
            {"agent": sanitize(agent), "tool": sanitize(tool), "action": action, "shadow_action": shadow,
             "differs": action != shadow, "calls": count}
            for (agent, tool, action, shadow), count in self.rows.items()
        ]
        rows.sort(key=lambda row: (not row["differs"], -row["calls"], row["agent"], row["tool"]))
        if self.overflow_calls:
            overflow = {"overflow": True, "calls": self.overflow_calls, "differing": self.overflow_differing}
            rows.append(overflow)
        return {
            "shadow_policy": {
                "path": str(store.path), "files": dict(store.files), "policy_set_digest": store.digest,
                "generation": store.generation, "last_error": str(error) if error is not None else None,
            },
            "calls": self.calls,
            "differing": self.differing,
            "rows": rows,
        }


def open_shadow_tally(policy: Decider, guard: EvidenceGuard) -> ShadowTally | None:
    """With a shadow policy, the tally ``GET /shadow`` shows, fed once per recorded call (the decision
    line reads the record itself; the metrics count with ``counted_shadow`` once given ``shadow_calls``)."""
    if not isinstance(policy, PolicyDecider) or policy.shadow is None:
        return None
    tally = ShadowTally(policy.shadow)
    guard.observers.append(tally.observe)
    return tally


__all__ = ["MAX_ROWS", "ShadowTally", "counted_shadow", "open_shadow_tally"]
