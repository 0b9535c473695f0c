"""The shape of a call's arguments, and a heuristic for text that looks like injected instructions.

Invariant: nothing computed here carries an argument *value*. The shape keeps
the keys of objects and the JSON type of every value; strings, numbers and
booleans are reduced to their type names. That is what lets the approval store
keep the shape next to the keyed argument digest while raw arguments are never
stored (DESIGN.md 4.7). Object keys are kept as written: they are the names of
parameters, and a tool that keys a map by data (file names, user ids) simply
gets a different shape per call, which only makes approval memory apply less.

Theory of operation.

* ``shape_of(value)`` maps JSON recursively: an object to an object of the same
  keys whose values are shapes; an array to the list of the *distinct* shapes
  of its elements, sorted by their canonical JSON (length and order are not
  part of the shape, ``[]`` is the empty array); every other value to one of
  the names ``"string"``, ``"number"``, ``"boolean"``, ``"null"``. Integers and
  fractions are both ``"number"``, as in JSON. The three forms (object, list,
  name) cannot be confused, so two argument trees have the same shape exactly
  when they have the same keys at the same places with the same value types.
  A value that is not JSON, or nesting deeper than ``MAX_DEPTH``, raises
  ``ShapeError``: without a shape there is no approval memory for the call.
* ``argument_shape(arguments)`` returns the shape as canonical JSON text
  (RFC 8785) and its digest ``sha256:<hex>`` over those bytes. Approval memory
  is keyed by (agent, tool, shape digest).

Injection heuristic. ``injection_findings(value)`` names the patterns (never
the text) that fire on any string in the arguments, object keys included;
``looks_like_injection`` is "any fired". Text nested deeper than ``MAX_DEPTH``
is not read and is reported as the finding ``nesting_too_deep``. Each string
is normalised first: NFKC (full-width and compatibility letters become
ASCII), format characters removed (zero-width spaces and joiners, bidi
controls), escaped ``\\n``, ``\\r`` and ``\\t`` (text JSON-encoded twice)
decoded, case folded. The patterns cover mesh7's twelve (gateway-behaviour.md
5.4) and more: "ignore/disregard/forget previous instructions" in their
variants, bare "disregard", role reassignment ("you are now", "from now on
you", "pretend to be", "act as a"), "system prompt" and "BEGIN SYSTEM"
framing, chat-template role tags (``<|im_start|>``, ``[INST]``, ``<<SYS>>``,
``<system>``), "### Instruction" headers, role prefixes at the start of a line
(``system:``), approval manipulation ("pre-approved", "do not escalate",
"must be approved", "confidence should be"), jailbreak names, and tool-call
syntax inside text (JSON with a tool name and arguments, ``"tool_calls"``, a
JSON-RPC ``tools/call``, ``<tool_call>`` and ``<function_calls>`` markup).

False-positive stance: a positive never denies a call and never changes what
the policy decided. It only takes away the approval-memory shortcut, so the
call goes to a person, who sees that injection was suspected and which
patterns fired. A false positive therefore costs one human look; a false
negative would let an injected call ride on earlier human approvals. The
patterns are tuned for recall: ordinary prose that says "disregard" or "act
as a proxy" is a positive, on purpose.

Non-claims: this does not detect injections in general. Text in other
languages, encodings (base64, URL-encoding), homoglyphs from other scripts or
instructions split across several arguments are not recognised, and the
pattern list is public, so an attacker who knows it can avoid it. It guards
one shortcut, which in any case applies only after several human approvals
of the same agent, tool and argument shape.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, canonical_bytes, canonical_text, jcs_digest

MAX_DEPTH: Final = 64
"""Deepest nesting (objects and arrays) a shape is computed for."""

STRING: Final = "string"
NUMBER: Final = "number"
BOOLEAN: Final = "boolean"
NULL: Final = "null"


class ShapeError(ValueError):
    """The arguments are not JSON, or nest too deeply to take a shape of."""


@dataclass(frozen=True, slots=True)
class ArgumentShape:
    """The shape of one call's arguments: canonical JSON text and its ``sha256:`` digest."""

    text: str
    digest: str


def shape_of(value: Any, *, _depth: int = 0) -> Any:
    """The shape of one JSON value (see the module docstring)."""
    if _depth > MAX_DEPTH:
        raise ShapeError(f"arguments nest deeper than {MAX_DEPTH} levels")
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, (int, float)):
        return NUMBER
    if isinstance(value, str):
        return STRING
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ShapeError(f"object key of type {type(key).__name__}; JSON keys are strings")
            out[key] = shape_of(item, _depth=_depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        distinct: dict[bytes, Any] = {}
        for item in value:
            element = shape_of(item, _depth=_depth + 1)
            try:
                distinct.setdefault(canonical_bytes(element), element)
            except CanonicalizationError as exc:
                raise ShapeError(f"array element cannot be canonicalised: {exc}") from None
        return [distinct[k] for k in sorted(distinct)]
    raise ShapeError(f"value of type {type(value).__name__} is not JSON")


def argument_shape(arguments: Mapping[str, Any]) -> ArgumentShape:
    """Shape and digest of a call's arguments (an object)."""
    if not isinstance(arguments, Mapping):
        raise ShapeError(f"arguments must be an object, not {type(arguments).__name__}")
    shape = shape_of(arguments)
    try:
        return ArgumentShape(text=canonical_text(shape), digest=jcs_digest(shape))
    except CanonicalizationError as exc:
        raise ShapeError(f"shape cannot be canonicalised: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Injection heuristic

_SEP: Final = r"[\s_\-]+"


def _phrase(template: str) -> str:
    """A regex source in which each single space of ``template`` stands for a word separator."""
    return template.replace(" ", _SEP)


_PREVIOUS: Final = (
    r"(?:(?:all|any|every|each|the|of|your|my|these|those|prior|previous|above|earlier|preceding|former"
    r"|foregoing|existing|original|system|safety|initial)" + _SEP + r"){0,4}"
)
_RULE_WORDS: Final = (
    r"(?:instructions?|prompts?|rules|directions|directives|guidelines|guardrails|context|messages?"
    r"|constraints|polic(?:y|ies)|restrictions|commands?)"
)

# (name, pattern): each is searched in normalised, case-folded text. Names go into evidence; text never does.
INJECTION_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = tuple(
    (name, re.compile(source, re.MULTILINE))
    for name, source in (
        (
            "ignore_instructions",
            r"\b(?:ignore|disregard|forget|override|bypass)" + _SEP + _PREVIOUS + _RULE_WORDS + r"\b",
        ),
        (
            "ignore_above",
            _phrase(
                r"\b(?:ignore|forget) (?:everything|all|anything) (?:above|before|previous|prior|else)\b"
            ),
        ),
        ("disregard", r"\bdisregard\b"),
        (
            "role_reassignment",
            "|".join(
                (
                    _phrase(r"\byou are now\b"),
                    _phrase(r"\bfrom now on") + r"[\s,]+you\b",
                    _phrase(r"\byour new (?:role|task|instructions?|goal|persona|job|purpose)\b"),
                    _phrase(r"\bnew (?:instructions?|system prompt|directives?)") + r"\s*:",
                    _phrase(r"\bpretend (?:you are|you're|to be|that you)\b"),
                    r"\brole[\s_\-]*play" + _SEP + r"as\b",
                    _phrase(r"\bact as\b"),
                )
            ),
        ),
        (
            "system_framing",
            "|".join(
                (
                    _phrase(r"\bsystem (?:prompt|message|instructions?|override)\b"),
                    _phrase(r"\bdeveloper (?:message|mode|instructions?)\b"),
                    _phrase(r"\b(?:begin|end|start) (?:of )?system\b"),
                    _phrase(
                        r"\b(?:reveal|print|show|repeat|output|leak) (?:your|the) (?:hidden )?"
                        r"(?:prompt|instructions)\b"
                    ),
                )
            ),
        ),
        (
            "role_tags",
            r"<\|\s*(?:im_start|im_end|im_sep|system|user|assistant|endoftext|eot_id|start_header_id"
            r"|end_header_id|begin_of_text)\s*\|>|<</?sys>>|\[/?inst\]|\[/?system\]"
            r"|</?\s*(?:system|assistant|developer|instructions?)\s*>",
        ),
        (
            "instruction_header",
            r"#{2,}\s*(?:instructions?|system|response|assistant|new" + _SEP + r"instructions?)\b",
        ),
        ("role_prefix_line", r"^[ \t]*(?:system|assistant|developer)[ \t]*:"),
        (
            "approval_manipulation",
            "|".join(
                (
                    r"\bpre[\s_\-]?approved\b",
                    _phrase(r"\balready (?:been )?(?:approved|authori[sz]ed)\b"),
                    r"\bauto[\s_\-]?approve",
                    _phrase(
                        r"\b(?:do not|don['\u2019]?t|never) "
                        r"(?:deny|escalate|refuse|reject|block|flag|report|ask)\b"
                    ),
                    _phrase(r"\bmust (?:be )?approv"),
                    _phrase(r"\bapprove (?:this|it|immediately|automatically|without)\b"),
                    _phrase(r"\bconfidence should be\b"),
                    _phrase(
                        r"\b(?:override|bypass) (?:the )?"
                        r"(?:policy|rules|safety|guardrails|restrictions|approvals?)\b"
                    ),
                )
            ),
        ),
        (
            "urgent_override",
            r"\b(?:important|attention|urgent|"
            + _phrase("note to (?:the )?(?:ai|assistant|model|agent|llm)")
            + r")\s*[:!]+\s*(?:this|override|approve|ignore|you|"
            + _phrase("the (?:ai|assistant|model|agent)")
            + r")\b",
        ),
        ("jailbreak", r"\bjailbr[eo]ak|" + _phrase(r"\bdan mode\b") + "|" + _phrase(r"\bdo anything now\b")),
        (
            "tool_call_text",
            "|".join(
                (
                    r'\\?"(?:name|tool|tool_name|function)\\?"\s*:\s*\\?"[^"\\]{1,200}\\?"\s*,\s*'
                    r'\\?"(?:arguments|args|parameters|input|params)\\?"\s*:',
                    r'\\?"(?:tool_calls|function_call|tool_use)\\?"\s*:',
                    r'\\?"method\\?"\s*:\s*\\?"tools/call',
                    r"</?\s*(?:tool_call|tool_use|function_calls?|invoke)\b",
                )
            ),
        ),
    )
)

_ESCAPED_WHITESPACE: Final = re.compile(r"\\[nrt]")


def normalise(text: str) -> str:
    """What the patterns see: NFKC, no format characters, escaped ``\\n``/``\\t`` decoded, case folded."""
    folded = unicodedata.normalize("NFKC", text)
    folded = "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")
    folded = _ESCAPED_WHITESPACE.sub(lambda m: " " if m.group(0) == "\\t" else "\n", folded)
    return folded.casefold()


TOO_DEEP: Final = "nesting_too_deep"
"""Finding reported when strings sit deeper than ``MAX_DEPTH``: unread text counts as suspect."""


def _strings(value: Any) -> tuple[list[str], bool]:
    """Every string in a JSON value, object keys included, and whether some lay deeper than MAX_DEPTH."""
    found: list[str] = []
    too_deep = False
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, (Mapping, list, tuple)):
            if depth >= MAX_DEPTH:
                too_deep = too_deep or len(item) > 0
                continue
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if isinstance(key, str):
                        found.append(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
    return found, too_deep


def injection_findings(value: Any) -> tuple[str, ...]:
    """Names of the patterns that fire on any string in ``value``, in pattern order; empty when none.

    Text nested deeper than ``MAX_DEPTH`` is not read, and its presence is itself a finding.
    """
    texts, too_deep = _strings(value)
    fired: set[str] = set()
    for text in texts:
        normalised = normalise(text)
        for name, pattern in INJECTION_PATTERNS:
            if name not in fired and pattern.search(normalised):
                fired.add(name)
    ordered = [name for name, _ in INJECTION_PATTERNS if name in fired]
    if too_deep:
        ordered.append(TOO_DEEP)
    return tuple(ordered)


def looks_like_injection(arguments: Any) -> bool:
    """True when any string in the arguments looks like injected instructions (see the stance above)."""
    return bool(injection_findings(arguments))
