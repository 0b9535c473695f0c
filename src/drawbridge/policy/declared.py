"""The declared contract of a policy set for one agent, in Assay's policy shape.

Invariant: the truth layer compares observed decisions with a contract that is a
pure function of the loaded policy set and the agent id, so the same policy
files always give the same ``declared_policy_digest`` (evidence-formats.md §2.5).

Theory of operation.

* An Assay-format policy (``--policy assay.yaml``) is its own declared contract:
  the dict ``parse_assay_policy`` returned when the file was loaded, so its digest
  equals Assay's byte for byte.
* A native policy set is translated, in evaluation order, over the policies that
  apply to the agent (``PolicySet.policies_for``):

  ============================  =================================================
  native rule                   declared contract (Assay shape)
  ============================  =================================================
  ``allow``                     its tool patterns join ``tools.allow``
  ``human_approval``            ``tools.allow`` and ``tools.approval_required``
  ``deny`` without conditions   ``tools.deny``, except the catch-all ``*`` while
                                some rule allows a tool (the allowlist already
                                says "nothing else"; a ``*`` in Assay's deny list
                                would contradict every allow)
  ``deny`` with conditions      nothing (Assay's lists cannot say "deny when")
  ``schemas``                   ``schemas``, the most specific policy's first
  ============================  =================================================

  ``version`` is ``"2.0"`` and ``enforcement.unconstrained_tools`` is ``"allow"``:
  the gateway runs an allowed tool that declares no schema, so the contract says so.

What the translation cannot carry, said plainly so no verdict over-claims:
first-match order (a deny rule below an allow for the same tool is shadowed in
the gateway but not in the contract, which makes such calls ``mismatch``, the
conservative side), argument conditions (conditional allows appear as plain
allows), and glob features Assay patterns lack (``?``, ``[...]``, an interior
``*``, any ``*`` that should stop at ``/``): such patterns are copied verbatim
and Assay reads them literally, so they match only a tool of that exact name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drawbridge.policy.model import Action, PolicySet

CATCH_ALL = "*"


def declared_contract(policy_set: PolicySet, agent: str) -> dict[str, Any]:
    """The Assay-shaped declared contract that ``agent``'s calls are compared with."""
    policies = policy_set.policies_for(agent)
    for policy in policies:
        if policy.assay_policy is not None and len(policies) == 1:
            return dict(policy.assay_policy)
    allow: list[str] = []
    deny: list[str] = []
    approval: list[str] = []
    schemas: dict[str, Any] = {}
    for policy in policies:
        for rule in policy.rules:
            patterns = [pattern.text for pattern in rule.tools]
            if rule.action is Action.ALLOW:
                allow.extend(patterns)
            elif rule.action is Action.HUMAN_APPROVAL:
                allow.extend(patterns)
                approval.extend(patterns)
            elif not rule.conditional:
                deny.extend(patterns)
        for tool, schema in policy.schemas.items():
            schemas.setdefault(tool, schema.schema)
    if allow:
        deny = [pattern for pattern in deny if pattern != CATCH_ALL]
    tools: dict[str, list[str]] = {}
    if allow:
        tools["allow"] = _unique(allow)
    if deny:
        tools["deny"] = _unique(deny)
    if approval:
        tools["approval_required"] = _unique(approval)
    return {
        "version": "2.0",
        "tools": tools,
        "schemas": schemas,
        "enforcement": {"unconstrained_tools": "allow"},
    }


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


class DeclaredContracts:
    """``agent -> contract``, recomputed only when the policy set changes (a hot reload).

    The same dict object is returned while the set is unchanged, so a consumer can
    cache what it derives from it (the declared digest) by identity.
    """

    def __init__(self, current: Callable[[], PolicySet]) -> None:
        self._current = current
        self._cache: dict[str, tuple[PolicySet, dict[str, Any]]] = {}

    def __call__(self, agent: str) -> dict[str, Any]:
        policy_set = self._current()
        cached = self._cache.get(agent)
        if cached is None or cached[0] is not policy_set:
            cached = (policy_set, declared_contract(policy_set, agent))
            self._cache[agent] = cached
        return cached[1]


def fixed_contract(allow_everything: bool) -> dict[str, Any]:
    """The contract of a gateway run without policy: ``--allow-all`` allows every tool, else none."""
    tools = {"allow": [CATCH_ALL]} if allow_everything else {"deny": [CATCH_ALL]}
    return {"version": "2.0", "tools": tools, "schemas": {}, "enforcement": {"unconstrained_tools": "allow"}}
