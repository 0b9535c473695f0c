"""What ``result_guards`` does to a ``CallToolResult``: replace secrets, measure it, cut it to a size.

Invariant: a secret found is replaced by ``[drawbridge: redacted <kind>]`` wherever the agent could
read it -- every string of the result (content items' text, an embedded resource's text and URI,
``structuredContent`` keys and values, ``_meta``), except the base64 of an image, an audio clip or a
resource blob -- and nothing here ever returns or counts the secret itself, only its kind. A private
key block split over the strings of a list, or over text content items (a BEGIN line without its
END), takes the following strings (text items) with it, up to its END line (``LineRedactor``, which
redacts an upstream's stderr too). A cut result's JSON is never longer than its limit, counting the
gateway's own notice, and a text is never cut inside a UTF-8 character.

Theory of operation. A result's size is the bytes of its compact JSON as sent: every member counts
(``_meta``, annotations, an embedded resource's URI, an empty item's braces). ``cut`` keeps
``resultType`` and ``isError``, then content items in order while their JSON fits, cuts the first
text that does not (its JSON, escapes counted; the rest is dropped), drops an item that cannot be cut
(a blob, or a text whose other members alone do not fit), drops ``structuredContent`` when it does not
fit (a cut JSON would not match the tool's output schema) and then marks the result ``isError``, and
keeps the result's other members (``_meta``, ...) only while they fit (a client refuses a success that lacks the structured content its tool's output schema
declares, and would show the agent nothing); one notice at the end says what was cut, in the words
the CLI upstream's ``max_output_bytes`` uses (``cut_notice``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from drawbridge.policy.secret_patterns import BUILTIN, MAX_SECRET_CHARS, PEM_BEGIN, PEM_BODY_CHARS, PEM_END, Detector, pem_spans

NOTICE_ROOM: Final = 512
"""The bytes a cut result keeps for the gateway's notice (``config_guards.MIN_MAX_BYTES`` is larger)."""
BLOB_TYPES: Final = frozenset({"image", "audio"})


def cut_notice(what: str, limit: int, more: int, setting: str) -> str:
    """The one wording of a cut: ``[drawbridge: stdout cut at 1024 bytes (max_output_bytes); 10 more
    bytes were not shown]``."""
    return f"[drawbridge: {what} cut at {limit} bytes ({setting}); {more} more bytes were not shown]"


# ------------------------------------------------------------------------------------ secrets


def _replacer(detector: Detector, found: Counter[str]) -> Callable[[Any], str]:
    marker = f"[drawbridge: redacted {detector.kind}]"
    grouped = "secret" in detector.pattern.groupindex

    def replace(match: Any) -> str:
        found[detector.kind] += 1
        if not grouped:
            return marker
        whole, start, end = match.group(0), match.start("secret") - match.start(), match.end("secret") - match.start()
        return whole[:start] + marker + whole[end:]

    return replace


def _replaced_spans(text: str, detector: Detector, found: Counter[str]) -> str:
    """The text with each of a ``spans`` detector's spans replaced by its marker."""
    assert detector.spans is not None
    parts: list[str] = []
    position = 0
    for start, stop in detector.spans(text):
        parts += [text[position:start], f"[drawbridge: redacted {detector.kind}]"]
        found[detector.kind] += 1
        position = stop
    return "".join([*parts, text[position:]]) if parts else text


WINDOW_CHARS: Final = 65536
"""The stretch of a long text an operator's pattern searches at once (``Detector.windowed``)."""


def _windowed_sub(pattern: re.Pattern[str], replace: Callable[[Any], str], text: str) -> str:
    """``pattern.sub`` over a long text, a window at a time. A match is at most ``MAX_SECRET_CHARS``
    long, so one that starts in a window ends within the window and that much after it."""
    parts: list[str] = []
    position = 0
    while position < len(text):
        stop = position + WINDOW_CHARS
        match = pattern.search(text, position, stop + MAX_SECRET_CHARS)
        if match is None or match.start() >= stop:
            parts.append(text[position:stop])
            position = stop
            continue
        parts += [text[position:match.start()], replace(match)]
        position = match.end()
    return "".join(parts)


def redactor(detectors: Sequence[Detector], found: Counter[str]) -> Callable[[str], str]:
    """A function replacing every secret the detectors find in a string; ``found`` counts them by kind.
    A detector runs only on a text holding one of its literals (``Detector.present``)."""
    steps = [(detector, _replacer(detector, found)) for detector in detectors]

    def redact(text: str) -> str:
        for detector, replace in steps:
            if not detector.present(text):
                continue
            if detector.spans is not None:
                text = _replaced_spans(text, detector, found)
            elif detector.windowed and len(text) > WINDOW_CHARS:
                text = _windowed_sub(detector.pattern, replace, text)
            else:
                text = detector.pattern.sub(replace, text)
        return text

    return redact


def redacted_text(text: str, detectors: Sequence[Detector] = BUILTIN) -> str:
    """One string with every secret the detectors find replaced (nothing counted)."""
    return redactor(detectors, Counter())(text)


PEM_MARKER: Final = "[drawbridge: redacted pem_private_key]"


class LineRedactor:
    """Redacts a run of strings that may split a private key block over several (the lines of an
    upstream's stderr, a list of strings in a result): each as ``redact`` does, and after a BEGIN line
    whose END is not in the same string, every following string up to and including its END line,
    for at most ``PEM_BODY_CHARS`` characters (bounded state: one count)."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        self._redact = redact
        self._left = 0
        """Characters of a key body still to redact; 0: not inside a block."""

    def __call__(self, text: str) -> str:
        if self._left > 0:
            end = PEM_END.search(text)
            if end is None:
                self._left = max(0, self._left - len(text) - 1)
                return PEM_MARKER
            self._left = 0
            text = PEM_MARKER + text[end.end():]
        begins = list(PEM_BEGIN.finditer(text))
        if begins and PEM_END.search(text, begins[-1].end()) is None:
            self._left = PEM_BODY_CHARS
        return self._redact(text)


def _walk(value: Any, redact: Callable[[str], str], keep: frozenset[str] = frozenset(), pem: bool = False) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        if pem:  # a key split over the strings of a list: the strings after its BEGIN line go too
            carry = LineRedactor(redact)
            return [carry(item) if isinstance(item, str) else _walk(item, redact, pem=pem) for item in value]
        return [_walk(item, redact) for item in value]
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            out[_unique(redact(key) if isinstance(key, str) else key, out)] = (
                item if key in keep else _walk(item, redact, pem=pem))
        return out
    return value


def _unique(key: Any, taken: Mapping[Any, Any]) -> Any:
    """A key that two secrets redacted alike would merge, numbered: ``[drawbridge: redacted github_token #2]``."""
    if key not in taken or not isinstance(key, str):
        return key
    number = 2
    while (numbered := f"{key[:-1]} #{number}]" if key.endswith("]") else f"{key} #{number}") in taken:
        number += 1
    return numbered


def _content_item(item: Any, redact: Callable[[str], str], pem: bool) -> Any:
    if not isinstance(item, Mapping):
        return _walk(item, redact, pem=pem)
    if item.get("type") in BLOB_TYPES:
        return _walk(item, redact, frozenset({"data"}), pem)
    resource = item.get("resource")
    if item.get("type") == "resource" and isinstance(resource, Mapping):
        return {**_walk({k: v for k, v in item.items() if k != "resource"}, redact, pem=pem),
                "resource": _walk(resource, redact, frozenset({"blob"}), pem)}
    return _walk(item, redact, pem=pem)


def _is_text(item: Any) -> bool:
    return isinstance(item, Mapping) and item.get("type") == "text" and isinstance(item.get("text"), str)


def _text_item(item: Mapping[str, Any], carry: Callable[[str], str], redact: Callable[[str], str]) -> dict[str, Any]:
    return {**_walk({k: v for k, v in item.items() if k != "text"}, redact), "text": carry(item["text"])}


def redacted(result: Mapping[str, Any], detectors: Sequence[Detector]) -> tuple[dict[str, Any], Counter[str]]:
    """The result with every secret replaced, and how many of each kind were found."""
    found: Counter[str] = Counter()
    redact = redactor(detectors, found)
    pem = any(detector.spans is pem_spans for detector in detectors)
    out: dict[str, Any] = {}
    for key, value in result.items():
        if key == "content" and isinstance(value, list):
            carry = LineRedactor(redact) if pem else redact  # a key split over text items, line by line
            out[key] = [_text_item(item, carry, redact) if _is_text(item) else _content_item(item, redact, pem)
                        for item in value]
        else:
            out[_unique(redact(key), out)] = _walk(value, redact, pem=pem)
    return out, found


# --------------------------------------------------------------------------------------- size


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def result_size(result: Mapping[str, Any]) -> int:
    """The bytes of the result as sent: its compact JSON (module docstring)."""
    return _json_size(result)


def _json_prefix(text: str, room: int) -> str:
    """The longest start of ``text`` whose JSON string (quotes left out) takes at most ``room`` bytes.
    Slicing a ``str`` never splits a character; an escape only adds bytes, so one shortening by the
    excess is enough."""
    data = _cut_utf8(text.encode("utf-8", "surrogatepass"), room).decode("utf-8", "surrogatepass")
    while data and (excess := _json_size(data) - 2 - room) > 0:
        data = data[: max(0, len(data) - excess)]
    return data


def _cut_utf8(data: bytes, room: int) -> bytes:
    """At most ``room`` bytes of ``data``, ending before a character that would not fit whole."""
    if room >= len(data):
        return data
    end = room
    while end > 0 and data[end] & 0xC0 == 0x80:  # a continuation byte: its character started before
        end -= 1
    return data[:end]


def _cut_text(item: Mapping[str, Any], room: int) -> tuple[Mapping[str, Any], int] | None:
    """A text item (or a resource's text) cut so that its JSON takes at most ``room`` bytes, with that
    size; None if it is not text, or if even its other members do not fit."""
    resource = item.get("resource")
    if item.get("type") == "text" and isinstance(item.get("text"), str):
        text, shell = item["text"], {**item, "text": ""}

        def rebuilt(cut_text: str) -> Mapping[str, Any]:
            return {**item, "text": cut_text}
    elif item.get("type") == "resource" and isinstance(resource, Mapping) and isinstance(resource.get("text"), str):
        text, shell = resource["text"], {**item, "resource": {**resource, "text": ""}}

        def rebuilt(cut_text: str) -> Mapping[str, Any]:
            return {**item, "resource": {**resource, "text": cut_text}}
    else:
        return None
    left = room - _json_size(shell)
    if left <= 0:
        return None
    shortened = rebuilt(_json_prefix(text, left))
    return shortened, _json_size(shortened)


ESSENTIAL: Final = frozenset({"resultType", "isError"})
"""The members a cut result always keeps (small: a known ``resultType``, a boolean)."""


def cut(result: Mapping[str, Any], max_bytes: int, size: int) -> tuple[dict[str, Any], int]:
    """The result cut to ``max_bytes`` of JSON (its notice included), and how many bytes were not shown."""
    budget = max_bytes - NOTICE_ROOM
    out: dict[str, Any] = {key: value for key, value in result.items() if key in ESSENTIAL}
    used = _json_size({**out, "isError": True, "content": []})  # room for isError, should it be set
    content = result.get("content")
    kept: list[Any] = []
    dropped = 0
    full = False
    for item in content if isinstance(content, list) else []:
        item_size = _json_size(item) + 1  # and its comma
        if not full and used + item_size <= budget:
            kept.append(item)
            used += item_size
            continue
        shortened = _cut_text(item, budget - used - 1) if not full and isinstance(item, Mapping) else None
        if shortened is not None:
            kept.append(shortened[0])
            used += shortened[1] + 1
        elif not (isinstance(item, Mapping) and item.get("type") == "text"):
            dropped += 1
        full = True
    notes = []
    if dropped:
        notes.append(f"{dropped} content item(s) that cannot be cut (images, audio, blobs) were dropped")
    if "structuredContent" in result:
        structured = _json_size({"structuredContent": result["structuredContent"]})
        if not full and used + structured <= budget:
            out["structuredContent"] = result["structuredContent"]
            used += structured
        else:  # a success without the structured content its output schema declares is refused by clients
            out["isError"] = True
            notes.append("structuredContent was dropped (a cut one would not match the tool's output schema), "
                         "so the result is marked isError")
    others = 0
    for key, value in result.items():
        if key in ESSENTIAL or key in ("content", "structuredContent"):
            continue
        member = _json_size({key: value})
        if not full and used + member <= budget:
            out[key] = value
            used += member
        else:
            full, others = True, others + 1
    if others:
        notes.append(f"{others} other member(s) of the result (such as _meta) were dropped")
    more = size - used
    notice = cut_notice("result", max_bytes, more, "result_guards")
    if notes:
        notice = notice[:-1] + "; " + "; ".join(notes) + "]"
    out["content"] = [*kept, {"type": "text", "text": notice}]
    return out, more


__all__ = ["NOTICE_ROOM", "PEM_MARKER", "LineRedactor", "cut", "cut_notice", "redacted", "redacted_text", "redactor", "result_size"]
