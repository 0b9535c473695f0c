"""The items of one listing that can be pinned, the pin-store definition of each, and a stored
definition read back to be shown as the server wrote it.

Invariant: an item is pinned only when its fingerprint can be taken and it names itself once; an
item listed twice under one name, with a name over ``MAX_NAME`` characters or with a pinned field
that is not JSON is named in ``skipped`` and never gets a definition, so the pins hold it back as
``new`` rather than pin one of its versions. Such an item is still offered: ``unpinnable`` says why it
cannot be pinned, so that it is refused saying so, listed for a person as such, and never taken for
removed when the server's pins are accepted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from drawbridge.canonical import canonical_bytes, sanitize, sha256_prefixed
from drawbridge.catalogue.fingerprint import TOOLS, PinnedKind
from drawbridge.state.pins import MAX_NAME, ToolDefinition


@dataclass(frozen=True, slots=True)
class Listed:
    """The tools of one catalogue that can be pinned, and their pin-store definitions."""

    tools: tuple[Mapping[str, Any], ...]
    definitions: Mapping[str, ToolDefinition]
    skipped: tuple[str, ...]
    """Listed names that cannot be pinned (held back as ``new``), sanitized for records."""
    unpinnable: Mapping[str, str] = field(default_factory=dict)
    """Listed name -> why it cannot be pinned ("it is listed more than once", ...): still offered, so
    never "removed", and refused saying why rather than as new."""


def _description(tool: Mapping[str, Any]) -> str | None:
    value = tool.get("description")
    return value if isinstance(value, str) else None


def pinnable(tools: Iterable[Any], kind: PinnedKind = TOOLS) -> Listed:
    """The listed tools (or prompts) that can be fingerprinted and pinned; the rest are named in ``skipped``."""
    counts: dict[str, int] = {}
    for item in tools:
        name = item.get("name") if isinstance(item, Mapping) else None
        if isinstance(name, str):
            counts[name] = counts.get(name, 0) + 1
    kept: list[Mapping[str, Any]] = []
    definitions: dict[str, ToolDefinition] = {}
    skipped: list[str] = []
    unpinnable: dict[str, str] = {}
    for item in tools:
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not name:
            continue  # never served: the catalogue refuses it too
        if counts[name] > 1:
            unpinnable[name] = "the server lists it more than once"
        elif len(name) > MAX_NAME:
            unpinnable[name] = f"its name is longer than {MAX_NAME} characters"
        else:
            try:
                document = canonical_bytes(kind.document(item))  # what the fingerprint is the digest of
            except ValueError as exc:
                unpinnable[name] = f"its definition cannot be fingerprinted ({sanitize(str(exc))[:200]})"
            else:
                kept.append(item)
                definitions[name] = ToolDefinition(
                    sha256_prefixed(document), _description(item), document.decode("utf-8")
                )
                continue
        skipped.append(sanitize(name)[:200])
    return Listed(tuple(kept), definitions, tuple(dict.fromkeys(skipped)), unpinnable)


def stored_document(definition: str | None) -> Mapping[str, Any] | None:
    """A pin's stored definition (JCS text, checked against its fingerprint by the store) as an object."""
    if definition is None:
        return None
    try:
        document = json.loads(definition)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def as_declared(key: str, value: Any) -> Any:
    """A pinned field as a server writes it: the pinned document holds every field of a prompt's
    argument (``null`` when not declared), but clients validate an argument's ``title`` and
    ``description`` as strings when present, so an undeclared one is left out, not sent as null."""
    if key != "arguments" or not isinstance(value, list):
        return value
    return [
        {k: v for k, v in argument.items() if v is not None} if isinstance(argument, Mapping) else argument
        for argument in value
    ]


__all__ = ["Listed", "as_declared", "pinnable", "stored_document"]
