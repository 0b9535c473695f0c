"""Assay-format policy text to a JSON value, with the line and column of every path (evidence-formats.md §4).

Invariant: the value is what the text means to every YAML reader, or the text is refused with
its line: no spelling whose meaning differs between readers reaches a digest or a verdict.

Theory of operation. YAML (JSON is YAML) is composed with ruamel.yaml's safe loader into nodes
and converted by us, so we control what a scalar means and keep a line/column for every path.
Refused, with the line: several documents, duplicate keys, non-string keys, merge keys (``<<``),
tags other than the core ones, recursive aliases, non-finite numbers, and numeric spellings whose
meaning differs between YAML readers (``1_000``, ``012``, ``0b1``): quote them or write them
plainly. The numbers follow ``canonical.yaml_numbers``, the rule the strict reader of native
policies and the configuration (``policy.strict_yaml``) shares.
A plain scalar that looks like a date stays a string, as in Assay's reader. A document
that expands to more nodes than ``_NODE_BUDGET`` (an alias bomb) or nests too deeply is refused
too, as is text that is not UTF-8 and a root that is not a mapping.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from drawbridge.canonical.yaml_numbers import NumberSpelling, float_value, integer_value
from drawbridge.evidence.truth.assay_errors import AssayPolicyError, Path

__all__ = ["load_text"]

_TAG = "tag:yaml.org,2002:"
_NODE_BUDGET = 1_000_000


class _YamlReader:
    """Nodes -> JSON values, recording the 1-based (line, column) of every path."""

    def __init__(self) -> None:
        self.positions: dict[Path, tuple[int, int]] = {}
        self._active: set[int] = set()
        self._count = 0

    def fail(self, node: Node, message: str, path: Path) -> NoReturn:
        mark = node.start_mark
        raise AssayPolicyError(message, kind="syntax", path=path, line=mark.line + 1, column=mark.column + 1)

    def convert(self, node: Node, path: Path) -> Any:
        self._count += 1
        if self._count > _NODE_BUDGET:
            self.fail(node, "document expands to too many nodes (alias bomb?)", path)
        self.positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if id(node) in self._active:
            self.fail(node, "recursive alias", path)
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _TAG + "seq":
                    self.fail(node, "unsupported tag on a sequence", path)
                return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
            if isinstance(node, MappingNode):
                if node.tag != _TAG + "map":
                    self.fail(node, "unsupported tag on a mapping", path)
                out: dict[str, Any] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == _TAG + "merge":
                        self.fail(key_node, "merge keys (<<) are not supported", path)
                    if not isinstance(key_node, ScalarNode) or key_node.tag != _TAG + "str":
                        self.fail(key_node, "mapping keys must be strings", path)
                    key = key_node.value
                    if key in out:
                        self.fail(key_node, "duplicate key", (*path, key))
                    out[key] = self.convert(value_node, (*path, key))
                return out
            self.fail(node, "unsupported YAML node", path)
        finally:
            self._active.discard(id(node))

    def _scalar(self, node: ScalarNode, path: Path) -> Any:
        tag, text = node.tag, node.value
        if tag in (_TAG + "str", _TAG + "timestamp"):
            # A plain date-like scalar is a string to the reference's reader.
            return text
        if tag == _TAG + "null":
            return None
        if tag == _TAG + "bool":
            return text.lower() == "true"
        try:
            if tag == _TAG + "int":
                return integer_value(text)
            if tag == _TAG + "float":
                return float_value(text)
        except NumberSpelling as exc:
            self.fail(node, exc.problem, path)
        self.fail(node, "unsupported tag on a scalar", path)


def load_text(text: str | bytes) -> tuple[Any, dict[Path, tuple[int, int]]]:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AssayPolicyError(f"policy is not UTF-8 (byte {exc.start})", kind="syntax") from None
    yaml = YAML(typ="safe", pure=True)
    try:
        root = yaml.compose(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise AssayPolicyError(
            f"not valid YAML/JSON: {exc.problem or exc.context or type(exc).__name__}",
            kind="syntax",
            line=mark.line + 1 if mark is not None else None,
            column=mark.column + 1 if mark is not None else None,
        ) from None
    except (YAMLError, RecursionError) as exc:
        raise AssayPolicyError(f"not valid YAML/JSON: {type(exc).__name__}", kind="syntax") from None
    if not isinstance(root, MappingNode):
        raise AssayPolicyError("policy root is not a YAML mapping", kind="root_not_mapping")
    reader = _YamlReader()
    try:
        value = reader.convert(root, ())
    except RecursionError:
        raise AssayPolicyError("policy nests too deeply", kind="syntax") from None
    return value, reader.positions
