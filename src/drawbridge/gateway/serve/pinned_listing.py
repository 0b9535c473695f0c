"""``pin_tools`` in serve's ``tools/list``: each held-back tool as the version a person accepted.

Invariant: no definition that nobody accepted is listed to an agent. A ``changed`` tool is listed as
its pinned definition, a ``new`` one (and every tool of a server whose pins cannot be read or were
never checked) not at all (``CataloguePins.listed``). The merged catalogue itself is unchanged: calls
resolve in it and are decided by the floors (``changed``: a person approves each call; ``new``:
refused), so this changes what the model reads, never a decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from drawbridge.catalogue.merged import Catalogue, CatalogueEntry
from drawbridge.gateway.pipeline.pins import CataloguePins


@dataclass
class _Shown:
    catalogue: Catalogue
    revision: int
    view: Catalogue


class PinnedListing:
    """The merged catalogue as agents are shown it under pinning, recomputed when the catalogue or
    the pins' published checks change (one view for all agents, so ``hide_denied_tools`` can cache on it)."""

    def __init__(self, pins: CataloguePins) -> None:
        self._pins = pins
        self._shown: _Shown | None = None

    def __call__(self, catalogue: Catalogue) -> Catalogue:
        revision = self._pins.revision
        shown = self._shown
        if shown is not None and shown.catalogue is catalogue and shown.revision == revision:
            return shown.view
        entries: list[CatalogueEntry] = []
        for entry in catalogue.entries:
            item = self._pins.listed(entry.server, entry.upstream_name, entry.item)
            if item is not None:
                entries.append(entry if item is entry.item else CatalogueEntry(
                    entry.server, entry.upstream_name, entry.name, {**item, "name": entry.name}
                ))
        view = Catalogue(catalogue.kind, tuple(entries), catalogue.problems, {e.name: e for e in entries})
        self._shown = _Shown(catalogue, revision, view)
        return view


__all__ = ["PinnedListing"]
