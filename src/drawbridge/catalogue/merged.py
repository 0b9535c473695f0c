"""The merged, namespaced catalogue of several upstream servers: ``server.tool`` names and their routes.

Invariant: every name the gateway advertises routes to exactly one (upstream, upstream name) pair, and
every advertised item is the upstream's own dict with only ``name`` replaced. An item whose name could
be read two ways (control or format characters, edge whitespace, empty, too long) or that collides
with another item of the same upstream is not advertised at all; it is reported as a
``CatalogueProblem`` instead, so an agent can never call something policy could misread.

Theory of operation. Upstream names (``[A-Za-z0-9_-]+``, enforced by the configuration) contain no
dot, so ``<server>.<name>`` splits unambiguously at its first dot even when the upstream's own name
has dots in it. ``build_catalogue`` walks the upstreams in configuration order and the items in the
order each upstream listed them, so the merged list is deterministic and an upstream's part of it is
in the upstream's own order. The same code namespaces tools and prompts (``kind`` only changes the
wording of problems). Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from drawbridge.canonical import sanitize
from drawbridge.catalogue.names import MAX_TOOL_NAME_CHARS, SEPARATOR, namespaced, tool_name_problem

MAX_SHOWN_NAME_CHARS: Final = 80


def shown(name: str) -> str:
    """A name made safe to put in a message: control characters replaced, length capped, JSON-quoted."""
    text = sanitize(name)
    if len(text) > MAX_SHOWN_NAME_CHARS:
        text = text[:MAX_SHOWN_NAME_CHARS] + "..."
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class CatalogueEntry:
    server: str
    upstream_name: str
    name: str
    """The namespaced name: ``server.upstream_name``."""
    item: Mapping[str, Any]
    """The upstream's dict, every field unchanged except ``name``."""


@dataclass(frozen=True, slots=True)
class CatalogueProblem:
    """An upstream item that is not advertised, and why (the name is shown sanitized, never raw)."""

    server: str
    index: int
    problem: str

    def describe(self) -> str:
        return f"upstream {self.server!r}, item {self.index}: {self.problem}"


@dataclass(frozen=True)
class Catalogue:
    kind: str
    entries: tuple[CatalogueEntry, ...] = ()
    problems: tuple[CatalogueProblem, ...] = ()
    _by_name: Mapping[str, CatalogueEntry] = field(default_factory=dict, repr=False, compare=False)

    def resolve(self, name: str) -> CatalogueEntry | None:
        """The route for a namespaced name, or None if the gateway does not advertise it."""
        return self._by_name.get(name)

    def listing(self) -> list[dict[str, Any]]:
        """The merged list as the agent receives it (fresh dicts; the entries stay untouched)."""
        return [dict(entry.item) for entry in self.entries]

    def names(self) -> list[str]:
        return [entry.name for entry in self.entries]


def item_problem(item: Any, server: str, kind: str) -> str | None:
    """Why one upstream item cannot be advertised, or None."""
    if not isinstance(item, Mapping):
        return f"the {kind} is not a JSON object"
    name = item.get("name")
    if not isinstance(name, str):
        return f"the {kind} has no string name"
    problem = tool_name_problem(name)
    if problem is not None:
        return f"{kind} {shown(name)}: {problem.replace('tool name', 'name')}"
    full = namespaced(server, name)
    if len(full) > MAX_TOOL_NAME_CHARS:
        return f"{kind} {shown(name)}: the namespaced name is longer than {MAX_TOOL_NAME_CHARS} characters"
    return None


def build_catalogue(sources: Sequence[tuple[str, Sequence[Any]]], kind: str = "tool") -> Catalogue:
    """Merge ``(server, items)`` pairs, in order, into one namespaced catalogue."""
    entries: list[CatalogueEntry] = []
    problems: list[CatalogueProblem] = []
    by_name: dict[str, CatalogueEntry] = {}
    servers_seen: set[str] = set()
    for server, items in sources:
        if server in servers_seen or SEPARATOR in server or not server:
            raise ValueError(f"upstream name {server!r} is empty, repeated or contains {SEPARATOR!r}")
        servers_seen.add(server)
        valid: list[tuple[str, Mapping[str, Any]]] = []
        seen_names: set[str] = set()
        duplicates: set[str] = set()
        for index, item in enumerate(items):
            problem = item_problem(item, server, kind)
            if problem is not None:
                problems.append(CatalogueProblem(server, index, problem))
                continue
            name = item["name"]
            if name in seen_names:
                duplicates.add(name)
                problems.append(
                    CatalogueProblem(
                        server, index, f"{kind} {shown(name)} is listed more than once; none of its copies is served"
                    )
                )
                continue
            seen_names.add(name)
            valid.append((name, item))
        for name, item in valid:
            if name in duplicates:
                continue
            full = namespaced(server, name)
            advertised = dict(item)
            advertised["name"] = full
            entry = CatalogueEntry(server=server, upstream_name=name, name=full, item=advertised)
            entries.append(entry)
            by_name[full] = entry
    return Catalogue(kind=kind, entries=tuple(entries), problems=tuple(problems), _by_name=by_name)
