"""The one strict reading of YAML text: policy files, tables of expected decisions, the configuration
(and the bounds, alone, of an OpenAPI document: ``check_bounds``).

Invariant: ``read_yaml`` returns ruamel's round-trip tree (``CommentedMap``, ``CommentedSeq``,
scalars; lines kept for every key and item) only when every value in it is plain JSON (strings,
numbers, booleans, null, lists, mappings) and the text is bounded: at most ``MAX_DEPTH`` levels of
lists and mappings and at most ``MAX_VALUES`` values once each alias is counted as a copy of its
anchor. Anything else raises ``YamlProblem(line, problem)``: one line, located where the text shows
it, never quoting a value (a value may be a secret). Each caller turns it into its own error
(``PolicyLoadError``, ``ConfigError``), both shown as ``file:line: problem``.

Refused: malformed YAML; more than one document; duplicate keys (the key is named, its values are
not); custom tags (``!foo``, ``!<tag:...>``, ``!`` and tags of another namespace) on a scalar, a list
or a mapping, the document's root included; YAML types that are not JSON (``date``, ``timestamp``,
``!!binary``, ``!!set``, ``!!omap``, ``!!pairs``); a core tag on a node it does not fit (``!!str
{...}``); a value that does not read as its core tag says (``!!int abc``); recursive aliases; and
text past the two bounds. Refused too, because YAML readers give them different meanings (the rule of
the Assay reader, shared through ``canonical.yaml_numbers``): merge keys (``<<``), a ``%YAML``
directive other than 1.2 (1.1 reads ``no`` as false, ``1:20`` as 80, ``010`` as 8), and numbers
spelled ``1_000``, ``012``, ``0b11``, ``0x_1``. The core tags of JSON values (``!!str``, ``!!int``,
``!!float``, ``!!bool``, ``!!null``, ``!!map``, ``!!seq``) are kept: ``!!str 5`` is the plain string
``"5"``, as a value and as a key (so ``!!str name`` beside ``name`` is a duplicate key).

Theory of operation. The text is read twice. First as a stream of parser events, which ruamel
produces without recursion, so any depth is safe to look at: depth, the expanded count (each
anchored node's size is remembered, each alias adds it), recursive aliases, tags and documents are
checked there, before anything is built. Then it is loaded with a round-trip constructor that names a
duplicate key by its key alone and checks the type of every scalar it builds; the composer and
the constructor recurse, which the depth bound makes safe, and the count bound keeps every walk of
the result (to JSON, a schema's compilation) short even through aliases.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedKeyMap, CommentedKeySeq, CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    Event,
    MappingStartEvent,
    NodeEvent,
    ScalarEvent,
)
from ruamel.yaml.nodes import ScalarNode

from drawbridge.canonical.yaml_numbers import NumberSpelling, float_value, integer_value

MAX_DEPTH = 64
"""Levels of lists and mappings a document may nest (an alias counts as the levels of its anchor)."""
MAX_VALUES = 100_000
"""Values a document may hold, each alias counted as a copy of its anchor (an alias bomb expands)."""

_CORE = "tag:yaml.org,2002:"
_FITTING = {
    "scalar": frozenset({"str", "int", "float", "bool", "null"}),
    "list": frozenset({"seq"}),
    "mapping": frozenset({"map"}),
}
_NOT_JSON_TAGS = frozenset({"binary", "timestamp", "set", "omap", "pairs"})
_SHOWN_CHARS = 80
_NON_FINITE = re.compile(r"[-+]?\.(?:inf|Inf|INF|nan|NaN|NAN)")


class YamlProblem(Exception):
    """Text that is not strict YAML of plain JSON values: ``line`` (1-based, or None) and a one-line
    ``problem`` that names no value. Not a ``ValueError``, so that no caller mistakes it for its own."""

    def __init__(self, line: int | None, problem: str) -> None:
        self.line = line
        self.problem = problem
        super().__init__(f"{line}: {problem}")


def _tag_shown(tag: str) -> str:
    text = "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag
    return json.dumps(text[:_SHOWN_CHARS])


def _kind(event: Event) -> str:
    if isinstance(event, ScalarEvent):
        return "scalar"
    return "mapping" if isinstance(event, MappingStartEvent) else "list"


def _check_tag(event: NodeEvent, line: int) -> None:
    tag = event.tag
    if tag is None:
        return
    tag = str(getattr(tag, "value", tag))
    kind = _kind(event)
    if tag.startswith(_CORE):
        name = tag[len(_CORE):]
        if name in _FITTING[kind]:
            return
        if name in _NOT_JSON_TAGS:
            raise YamlProblem(line, f"a value of YAML type {name} is not plain JSON")
        if any(name in names for names in _FITTING.values()):
            raise YamlProblem(line, f"the tag {_tag_shown(tag)} does not fit a {kind}")
    raise YamlProblem(line, f"custom tag {_tag_shown(tag)}: custom tags are errors (values are plain JSON)")


@dataclass(slots=True)
class _Open:
    """A list or mapping whose end the event pass has not reached yet."""

    anchor: str | None
    values_before: int
    depth_before: int
    deepest: int
    """The deepest level reached inside it so far (aliases count their anchor's levels)."""


class _Bounds:
    """The event pass: depth, expanded size, recursive aliases, tags and documents."""

    def __init__(self, *, yaml_1_2_only: bool = False) -> None:
        self.yaml_1_2_only = yaml_1_2_only
        self.values = 0
        self.open: list[_Open] = []
        self.sizes: dict[str, tuple[int, int]] = {}  # anchor -> (values, levels of lists and mappings)
        self.documents = 0

    def add(self, values: int, levels: int, line: int) -> None:
        self.values += values
        if self.values > MAX_VALUES:
            raise YamlProblem(
                line, f"the file holds more than {MAX_VALUES:,} values, counting each alias as a copy "
                "of its anchor (anchors and aliases that expand this far are refused)",
            )
        depth = len(self.open) + levels
        if depth > MAX_DEPTH:
            raise YamlProblem(
                line, f"the file nests too deeply (more than {MAX_DEPTH} levels of lists and mappings)"
            )
        if self.open:
            self.open[-1].deepest = max(self.open[-1].deepest, depth)

    def event(self, event: Event) -> None:
        line = event.start_mark.line + 1
        if isinstance(event, DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise YamlProblem(
                    line, "invalid YAML: more than one YAML document (a file holds exactly one)"
                )
            version = getattr(event, "version", None)
            if self.yaml_1_2_only and version is not None and tuple(version) != (1, 2):
                raise YamlProblem(
                    line, "a %YAML directive other than 1.2 is refused: YAML 1.1 reads values differently "
                    "(no is false, 1:20 is 80, 010 is 8); remove the directive",
                )
        elif isinstance(event, AliasEvent):
            if any(frame.anchor == event.anchor for frame in self.open):
                raise YamlProblem(line, f"a recursive alias: *{event.anchor} is inside its own anchor")
            values, levels = self.sizes.get(event.anchor, (1, 0))
            self.add(values, levels, line)
        elif isinstance(event, ScalarEvent):
            _check_tag(event, line)
            self.add(1, 0, line)
            if event.anchor is not None:
                self.sizes[event.anchor] = (1, 0)
        elif isinstance(event, CollectionStartEvent):
            _check_tag(event, line)
            depth = len(self.open)
            self.add(1, 1, line)
            self.open.append(_Open(event.anchor, self.values - 1, depth, depth + 1))
        elif isinstance(event, CollectionEndEvent):
            done = self.open.pop()
            if done.anchor is not None:
                self.sizes[done.anchor] = (self.values - done.values_before, done.deepest - done.depth_before)
            if self.open:
                self.open[-1].deepest = max(self.open[-1].deepest, done.deepest)


def _type_name(value: Any) -> str:
    if isinstance(value, TaggedScalar):
        tag = str(getattr(value.tag, "value", value.tag))
        return tag[len(_CORE):] if tag.startswith(_CORE) else "tagged"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, (bytes, bytearray)):
        return "binary"
    return type(value).__name__


def _key_shown(key: Any) -> str:
    text = key if isinstance(key, str) else str(key)
    shown = json.dumps(text[:_SHOWN_CHARS])
    return shown if len(text) <= _SHOWN_CHARS else shown[:-1] + '..."'


class _Constructor(RoundTripConstructor):
    """Round-trip construction that names a duplicate key by the key alone (ruamel's own error quotes
    both values) and refuses a scalar that is not plain JSON where it stands."""

    def check_mapping_key(self, node: Any, key_node: Any, mapping: Any, key: Any, value: Any) -> bool:
        line = key_node.start_mark.line + 1
        if isinstance(key, (CommentedKeySeq, CommentedKeyMap)):
            raise YamlProblem(line, "a mapping key that is a list or a mapping is not plain JSON")
        if key in mapping:
            raise YamlProblem(line, f"invalid YAML: duplicate key {_key_shown(key)}")
        return True

    def flatten_mapping(self, node: Any) -> Any:
        for key_node, _ in node.value:
            if str(getattr(key_node.tag, "value", key_node.tag)) == _CORE + "merge":
                raise YamlProblem(
                    key_node.start_mark.line + 1,
                    "merge keys (`<<`) are refused: readers differ on what they merge and which value wins; "
                    "write the keys out",
                )
        return super().flatten_mapping(node)

    def construct_non_recursive_object(self, node: Any, tag: str | None = None) -> Any:
        line = node.start_mark.line + 1
        try:
            data = super().construct_non_recursive_object(node, tag)
        except (YamlProblem, YAMLError):
            raise
        except (ValueError, KeyError, TypeError, OverflowError):  # ``!!int abc``: ruamel's int() fails
            shown = _tag_shown(str(getattr(node.tag, "value", node.tag)))
            problem = f"invalid YAML: the value does not read as its tag {shown} says"
            raise YamlProblem(line, problem) from None
        if isinstance(node, ScalarNode):
            _check_number(node, line)
        if isinstance(data, TaggedScalar):
            tag = str(getattr(data.tag, "value", data.tag))
            if tag == _CORE + "str":
                return str(data.value)  # ``!!str x`` is the string x, a key like any other
        if isinstance(node, ScalarNode) and not (data is None or isinstance(data, (str, int, float))):
            raise YamlProblem(line, f"a value of YAML type {_type_name(data)} is not plain JSON")
        return data


def _check_number(node: ScalarNode, line: int) -> None:
    """An integer or a float (resolved or tagged) spelled as every YAML reader reads it
    (``canonical.yaml_numbers``); ``.inf`` and ``.nan`` are left to the callers, which say why."""
    tag = str(getattr(node.tag, "value", node.tag))
    try:
        if tag == _CORE + "int":
            integer_value(node.value)
        elif tag == _CORE + "float" and not _NON_FINITE.fullmatch(node.value):
            float_value(node.value)
    except NumberSpelling as exc:
        what = "an integer" if exc.integer else "a number"
        raise YamlProblem(
            line, f"{what} spelled so that YAML readers read it differently (such as 1_000, 012, 0b1, "
            "0x_1, 1e_3): write it plainly (1000, 12) or quote it",
        ) from None


def key_line(node: CommentedMap, key: Any) -> int:
    """The 1-based line of ``key`` in a mapping of the tree (the mapping's own when the key has none:
    a key merged in with ``<<``)."""
    try:
        return int(node.lc.key(key)[0]) + 1
    except (KeyError, TypeError, AttributeError):
        return node_line(node)


def value_line(node: CommentedMap, key: Any) -> int:
    """The 1-based line where the value of ``key`` starts."""
    try:
        return int(node.lc.value(key)[0]) + 1
    except (KeyError, TypeError, AttributeError):
        return key_line(node, key)


def item_line(node: CommentedSeq, index: int, default: int) -> int:
    """The 1-based line of a list's item ``index`` (``default`` when it has none)."""
    try:
        return int(node.lc.item(index)[0]) + 1
    except (KeyError, TypeError, AttributeError, IndexError):
        return default


def node_line(node: Any, default: int = 1) -> int:
    """The 1-based line where a list or a mapping starts (``default`` for a plain value)."""
    lc = getattr(node, "lc", None)
    if lc is None or lc.line is None:
        return default
    return int(lc.line) + 1


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def yaml_problem(exc: YAMLError) -> YamlProblem:
    """A ruamel error as a ``YamlProblem``: its line and problem, without the snippet of text it quotes."""
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = _one_line(str(exc.problem or exc.context or "malformed YAML"))
        return YamlProblem(mark.line + 1 if mark is not None else None, f"invalid YAML: {problem}")
    return YamlProblem(None, f"invalid YAML: {_one_line(str(exc)) or type(exc).__name__}")


def check_bounds(text: str, *, yaml_1_2_only: bool = False) -> None:
    """The event pass alone (depth, expanded size, recursive aliases, tags, one document), for a reader
    that builds its own values, such as an OpenAPI document's; raises ``YamlProblem``. ``read_yaml``
    also refuses a ``%YAML`` directive other than 1.2 (``yaml_1_2_only``)."""
    try:
        bounds = _Bounds(yaml_1_2_only=yaml_1_2_only)
        for event in YAML(typ="safe", pure=True).parse(text):
            bounds.event(event)
    except YAMLError as exc:
        raise yaml_problem(exc) from None


def read_yaml(text: str) -> Any:
    """The round-trip tree of ``text`` (None when it holds no document), or ``YamlProblem``."""
    check_bounds(text, yaml_1_2_only=True)
    yaml = YAML(typ="rt")
    yaml.Constructor = _Constructor
    try:
        return yaml.load(text)
    except YAMLError as exc:
        raise yaml_problem(exc) from None


__all__ = [
    "MAX_DEPTH", "MAX_VALUES", "YamlProblem", "check_bounds", "item_line", "key_line", "node_line", "read_yaml", "value_line",
    "yaml_problem",
]
