"""A declared policy read once for the verdicts of many calls (evidence-formats.md §2.7, 2.8).

Invariant: ``prepared_decision_verdict(prepare_policy(p), ...)`` is ``decision_verdict(p, ...)``
for every policy, call and evidence: the same axes folded over the same normalized view, only
not read again per call.

Theory of operation. ``prepare_policy`` reads the policy once (``normalize_assay_policy``); the
``PreparedPolicy`` keeps that view and a memo of each tool's compiled validator, and
``prepared_decision_verdict`` folds the axes of ``verdict.view_axes`` over them. The verdicts of a
tool without a schema depend on its arguments only through whether they were captured, so they
are kept per (tool, captured or not, identity, evidence), in a bounded cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drawbridge.evidence.truth.assay_policy import normalize_assay_policy
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.verdict import lattice_max, view_axes

__all__ = ["PreparedPolicy", "prepare_policy", "prepared_decision_verdict"]

_FIXED_MAX = 1024


class PreparedPolicy:
    """A policy read once for many verdicts: its normalized view and each tool's compiled schema.

    ``decision_verdict`` reads the policy (``normalize_assay_policy``) and prepares the tool's
    schema on every call; a producer that judges every call against the same declared contract
    prepares it once here and calls ``prepared_decision_verdict``, which gives the same verdict.
    The view is a private copy, never handed out, so what was prepared cannot change afterwards.
    A policy that cannot be read raises ``AssayPolicyError`` here, as ``decision_verdict`` would.
    """

    __slots__ = ("_fixed", "_validators", "_view")

    def __init__(self, policy: Mapping[str, Any]) -> None:
        self._view = normalize_assay_policy(policy)
        self._validators: dict[str, Any] = {}
        self._fixed: dict[Any, tuple[dict[str, str], str]] = {}

    def verdict(self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None) -> str:
        """The lattice maximum of the axes."""
        return self._judged(tool_name, args, identity_state, evidence)[1]

    def axes(
        self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None = None
    ) -> dict[str, str]:
        return dict(self._judged(tool_name, args, identity_state, evidence)[0])

    def _judged(
        self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None
    ) -> tuple[dict[str, str], str]:
        """The axes and their lattice maximum; kept per (tool, captured or not, identity, evidence)
        for a tool without a schema, whose arguments then count only as captured or not (the args
        axis is ``incomplete`` or the unconstrained mode). The axes dict is shared: callers copy it
        before handing it out."""
        if not isinstance(tool_name, str):
            raise TypeError("tool_name must be a string")
        if tool_name != "$defs" and tool_name in self._view["schemas"]:
            return self._judge(tool_name, args, identity_state, evidence)
        key = (tool_name, args is None, identity_state, evidence)
        try:
            found = self._fixed.get(key)
        except TypeError:  # an unhashable identity state or evidence: nothing to keep
            return self._judge(tool_name, args, identity_state, evidence)
        if found is None:
            found = self._judge(tool_name, args, identity_state, evidence)
            if len(self._fixed) >= _FIXED_MAX:
                self._fixed.clear()
            self._fixed[key] = found
        return found

    def _judge(
        self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None
    ) -> tuple[dict[str, str], str]:
        axes = view_axes(self._view, self._validators, tool_name, args, identity_state, evidence)
        return axes, lattice_max(axes.values())


def prepare_policy(policy: Mapping[str, Any]) -> PreparedPolicy:
    """Read ``policy`` once for ``prepared_decision_verdict``."""
    return PreparedPolicy(policy)


def prepared_decision_verdict(
    prepared: PreparedPolicy,
    tool_name: str,
    args: Any | None,
    identity_state: str,
    evidence: Evidence | None = None,
) -> str:
    """``decision_verdict`` against a policy prepared by ``prepare_policy``: the same verdict."""
    return prepared.verdict(tool_name, args, identity_state, evidence)
