"""``hide_denied_tools``: each agent's ``tools/list`` without the tools it could only be refused.

Invariant: a tool is left out of an agent's list only when every path through its policy ends in deny
after the tool's floor (``catalogue.decisions.is_hidden``); its calls are still decided, so hiding
changes no decision. The list is recomputed when the policy set, the catalogue or the pins change
(a cache per agent, keyed by all three).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.catalogue.decisions import is_hidden
from drawbridge.catalogue.floors import Floor
from drawbridge.catalogue.merged import Catalogue, CatalogueEntry
from drawbridge.policy.model import PolicySet

FILTER_CACHE_AGENTS: Final = 1024


@dataclass
class _Visible:
    policy_set: PolicySet
    catalogue: Catalogue
    revision: int
    names: frozenset[str]


class VisibleTools:
    """The ``hide_denied_tools`` filter: an agent's ``tools/list`` without the tools it could only be
    refused, every path through its policy ending in deny after the tool's floor."""

    def __init__(self, store: Any, floor: Callable[[CatalogueEntry], Floor], revision: Callable[[], int]) -> None:
        self._store = store
        self._floor = floor
        self._revision = revision
        self._cache: dict[str, _Visible] = {}

    def names(self, agent: str, catalogue: Catalogue) -> frozenset[str]:
        policy_set = self._store.current
        revision = self._revision()
        cached = self._cache.get(agent)
        if (
            cached is not None
            and cached.policy_set is policy_set
            and cached.catalogue is catalogue
            and cached.revision == revision
        ):
            return cached.names
        names = frozenset(
            entry.name
            for entry in catalogue.entries
            if not is_hidden(policy_set, agent, entry.name, self._floor(entry))
        )
        if len(self._cache) >= FILTER_CACHE_AGENTS:
            self._cache.clear()
        self._cache[agent] = _Visible(policy_set, catalogue, revision, names)
        return names

    def __call__(self, agent: str, catalogue: Catalogue) -> list[dict[str, Any]]:
        visible = self.names(agent, catalogue)
        return [dict(entry.item) for entry in catalogue.entries if entry.name in visible]


__all__ = ["VisibleTools"]
