"""Pinning a server's catalogue: tool fingerprints, and how the current catalogue compares with the pins.

Invariant: a tool's fingerprint changes exactly when something the model or the policy reads
about the tool changes. It is ``sha256:`` + hex over the RFC 8785 (JCS) bytes of this object,
and of nothing else::

    {"name": ..., "title": ..., "description": ...,
     "inputSchema": ..., "outputSchema": ..., "annotations": ...}

- every key is always present; a field the tool does not declare is ``null`` (an absent title
  and ``"title": null`` both mean "no title");
- ``inputSchema`` is pinned whole, with its top-level ``required`` list sorted and without
  duplicates (a set, whatever order the server emits it in). JCS sorts object keys, so the
  parameter schemas under ``properties`` are hashed sorted by parameter name, and ``required``,
  ``$defs``, ``additionalProperties`` are pinned with them (a ``$ref`` target is part of what a
  parameter accepts);
- beyond mesh7's fingerprint (description, parameter schemas, annotations) the title, the
  output schema and the tool's own name are pinned: a fingerprint of one tool never equals
  that of a tool with another name, so a rename is a removal plus a new tool;
- not pinned: ``_meta``, ``icons``, ``execution`` and fields unknown to the protocol (they are
  forwarded untouched but are not the tool's contract).

A prompt's fingerprint (``prompt_fingerprint``, for ``pin_prompts``) is ``sha256:`` + hex over the
JCS bytes of ``{"name", "title", "description", "arguments"}``, on the same rules: every key present
(``null`` when not declared), ``arguments`` a list sorted by argument name (``[]`` when the prompt
declares none), each argument exactly ``{"name", "title", "description", "required"}`` with
``required`` ``true`` only when the argument says so (absent and ``false`` are the same contract).
An argument without a string name, an argument name given twice or a ``required`` that is not a
boolean cannot be fingerprinted (``ValueError``: the prompt is held back). ``_meta``, ``icons`` and
unknown fields are not pinned. The text a prompt renders comes from ``prompts/get`` and cannot be
pinned ahead of a call; what is pinned is what the model and the person choose the prompt by.

Theory of operation. ``compare`` takes the pins stored for one server (``None`` when the server
has never been seen) and its current ``tools/list`` items, and gives each current tool a status:
``pinned`` (fingerprint equal to the pin), ``new`` (no pin for that name), ``changed``
(fingerprint differs), plus the pinned names that are gone. A server seen for the first time is
pinned whole (trust on first use): every tool is ``pinned`` and ``pins`` holds them all. Pins
change only through ``accept`` (a person accepting a server or a few tools), never by
comparing. ``floors.py`` turns the statuses into floors. Pure: the pin store is the shell's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import is_sha256_digest, jcs_digest

PINNED_FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


class PinStatus(enum.StrEnum):
    PINNED = "pinned"
    NEW = "new"
    CHANGED = "changed"


def _plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists, so that any JSON-shaped input hashes the same."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _tool_name(tool: Any) -> str:
    if not isinstance(tool, Mapping):
        raise ValueError("a tool is a JSON object")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool needs a non-empty string name")
    return name


def _input_schema(schema: Any) -> Any:
    schema = _plain(schema)
    if isinstance(schema, dict):
        required = schema.get("required")
        if isinstance(required, list) and all(isinstance(item, str) for item in required):
            schema["required"] = sorted(set(required))
    return schema


def pinned_document(tool: Mapping[str, Any]) -> dict[str, Any]:
    """Exactly what the fingerprint covers (see the module docstring)."""
    _tool_name(tool)
    document = {field: _plain(tool.get(field)) for field in PINNED_FIELDS}
    document["inputSchema"] = _input_schema(tool.get("inputSchema"))
    return document


def tool_fingerprint(tool: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` over the JCS bytes of ``pinned_document(tool)``.

    Raises ``ValueError`` (``CanonicalizationError``) for a tool without a name or with a
    pinned field that is not JSON.
    """
    return jcs_digest(pinned_document(tool))


PROMPT_FIELDS: Final = ("name", "title", "description", "arguments")
ARGUMENT_FIELDS: Final = ("name", "title", "description", "required")


def _argument(argument: Any) -> dict[str, Any]:
    if not isinstance(argument, Mapping) or not isinstance(argument.get("name"), str):
        raise ValueError("a prompt argument is a JSON object with a string name")
    required = argument.get("required")
    if required is not None and not isinstance(required, bool):
        raise ValueError(f"prompt argument {argument['name']!r}: required must be a boolean")
    document = {field: _plain(argument.get(field)) for field in ARGUMENT_FIELDS}
    document["required"] = required is True
    return document


def prompt_document(prompt: Mapping[str, Any]) -> dict[str, Any]:
    """Exactly what a prompt's fingerprint covers (see the module docstring)."""
    _tool_name(prompt)
    arguments = prompt.get("arguments")
    if arguments is None:
        arguments = []
    if not isinstance(arguments, (list, tuple)):
        raise ValueError("a prompt's arguments are a list")
    listed = sorted((_argument(argument) for argument in arguments), key=lambda a: a["name"])
    names = [argument["name"] for argument in listed]
    if len(set(names)) != len(names):
        raise ValueError("a prompt argument is named more than once")
    document = {field: _plain(prompt.get(field)) for field in PROMPT_FIELDS}
    document["arguments"] = listed
    return document


def prompt_fingerprint(prompt: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` over the JCS bytes of ``prompt_document(prompt)``; ``ValueError`` as above."""
    return jcs_digest(prompt_document(prompt))


@dataclass(frozen=True, slots=True)
class PinnedKind:
    """What is pinned of one kind of catalogue item: its name in records and the pin store, the
    fields its fingerprint covers, and the document the fingerprint is the digest of."""

    name: str
    fields: tuple[str, ...]
    document: Callable[[Mapping[str, Any]], dict[str, Any]]

    def fingerprint(self, item: Mapping[str, Any]) -> str:
        return jcs_digest(self.document(item))


TOOLS: Final = PinnedKind("tool", PINNED_FIELDS, pinned_document)
PROMPTS: Final = PinnedKind("prompt", PROMPT_FIELDS, prompt_document)


@dataclass(frozen=True, slots=True)
class ToolPin:
    """One current tool: its fingerprint now, the one accepted (if any), and the status."""

    name: str
    fingerprint: str
    status: PinStatus
    pinned_fingerprint: str | None


@dataclass(frozen=True, slots=True)
class PinComparison:
    """One server's current catalogue against its pins."""

    tools: tuple[ToolPin, ...]
    removed: tuple[str, ...]
    """Pinned names the server no longer lists, sorted."""
    first_sight: bool
    """No pins existed: the catalogue is pinned whole and every tool is ``pinned``."""
    pins: Mapping[str, str]
    """The pins to keep after this comparison: all current fingerprints on first sight, else
    the pins as they were (only ``accept`` moves them)."""

    @property
    def statuses(self) -> dict[str, PinStatus]:
        return {tool.name: tool.status for tool in self.tools}

    def status(self, name: str) -> PinStatus | None:
        """The status of a current tool, or None when the server does not list it."""
        for tool in self.tools:
            if tool.name == name:
                return tool.status
        return None

    @property
    def held_back(self) -> tuple[ToolPin, ...]:
        """Tools that are not as accepted (``new`` or ``changed``)."""
        return tuple(tool for tool in self.tools if tool.status is not PinStatus.PINNED)


def _check_pins(pinned: Mapping[str, str]) -> None:
    for name, fingerprint in pinned.items():
        if not isinstance(name, str) or not name:
            raise ValueError("a pinned tool name must be a non-empty string")
        if not is_sha256_digest(fingerprint):
            raise ValueError(f"the pin for tool {name!r} is not a sha256 fingerprint")


def compare(
    pinned: Mapping[str, str] | None, current: Iterable[Mapping[str, Any]], kind: PinnedKind = TOOLS
) -> PinComparison:
    """Status of every current tool of one server against that server's pins.

    ``pinned`` is ``None`` for a server never seen (it is pinned whole); an empty mapping is a
    server pinned with no tools, so every tool it lists now is ``new``. A malformed pin or a
    name listed twice raises ``ValueError``: a pin store that cannot be read must stop the
    gateway, not pin something else.
    """
    if pinned is not None:
        _check_pins(pinned)
    tools: list[ToolPin] = []
    seen: set[str] = set()
    for item in current:
        name = _tool_name(item)
        if name in seen:
            raise ValueError(f"tool {name!r} is listed more than once")
        seen.add(name)
        fingerprint = kind.fingerprint(item)
        accepted = None if pinned is None else pinned.get(name)
        if pinned is None or accepted == fingerprint:
            status = PinStatus.PINNED
        elif accepted is None:
            status = PinStatus.NEW
        else:
            status = PinStatus.CHANGED
        tools.append(ToolPin(name, fingerprint, status, fingerprint if pinned is None else accepted))
    if pinned is None:
        return PinComparison(tuple(tools), (), True, {tool.name: tool.fingerprint for tool in tools})
    removed = tuple(sorted(name for name in pinned if name not in seen))
    return PinComparison(tuple(tools), removed, False, dict(pinned))


def accept(comparison: PinComparison, names: Iterable[str] | None = None) -> dict[str, str]:
    """The pins after a person accepts the server (``names=None``) or some of its tools.

    Accepting the server pins its current catalogue exactly: removed tools are forgotten (if
    one comes back it is ``new``). Accepting named tools pins their current fingerprints and
    keeps every other pin. Naming a tool the server does not list raises ``ValueError``.
    """
    current = {tool.name: tool.fingerprint for tool in comparison.tools}
    if names is None:
        return current
    pins = dict(comparison.pins)
    for name in names:
        if name not in current:
            raise ValueError(f"tool {name!r} is not in the server's current catalogue")
        pins[name] = current[name]
    return pins
