"""Assay-format policies (``--policy FILE``) converted into one native policy.

Invariant: the converted policy decides every call at least as strictly as
Assay's enforcement engine (evidence-formats.md §4.6) decides it, and reads
tool names exactly as Assay does (``matches_tool_pattern``, not our globs).
Where Assay only records an obligation, the gateway enforces it or says in
docs/policy-format.md that it does not.

Theory of operation. The text is read by ``parse_assay_policy`` (Assay's own
file reading: legacy lists merged, constraints migrated into schemas), then
rebuilt as a native ``Policy`` for every agent (``agent: "*"``), named after
the Assay ``name`` or else the file's stem. Assay's gate order becomes
first-match rules, emitting only the rules the file needs:

====  =========================================  ==================================
rule  matches (Assay's meaning)                  action
====  =========================================  ==================================
a     ``tools.deny`` patterns, or a tool whose    deny (E_TOOL_DENIED)
      ``tool_classes`` meet ``deny_classes``
b     a tool outside the allowlist (``tools.allow``  deny (E_TOOL_NOT_ALLOWED)
      patterns and tools of ``allow_classes``),
      only when an allowlist is declared
c     a tool with no schema, only when            deny (E_TOOL_UNCONSTRAINED)
      ``enforcement.unconstrained_tools: deny``
d     ``approval_required`` patterns, or a tool    human_approval (Assay: an
      of ``approval_required_classes``            obligation only; here enforced)
e     every tool                                  allow (``warn`` is allow here)
====  =========================================  ==================================

``schemas`` become native schemas (the shared ``$defs`` entry merged into each
tool's schema as Assay's ``prepare_tool_schema`` does); a call that violates
one is denied (E_ARG_SCHEMA), and a schema that does not compile is a load
error rather than a per-tool deny (E_SCHEMA_COMPILE). Not enforced by the
converted policy: ``tool_pins`` (the catalogue's pin floors do that job),
``limits``, ``restrict_scope``/``redact_args`` obligations, ``signatures``,
``discovery``, ``runtime_monitor``, ``kill_switch``. Keys Assay does not know
are load errors here, as everywhere in drawbridge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap

from drawbridge.evidence.truth.assay_errors import AssayPolicyError
from drawbridge.evidence.truth.assay_fields import unknown_policy_fields
from drawbridge.evidence.truth.assay_policy import parse_assay_policy
from drawbridge.evidence.truth.patterns import matches_tool_pattern
from drawbridge.policy.errors import PolicyLoadError
from drawbridge.policy.globs import compile_glob
from drawbridge.policy.model import Action, Policy, Rule, ToolPattern, ToolSchema
from drawbridge.policy.schemas import SchemaLoadError, compile_schema


@dataclass(frozen=True, slots=True)
class AssayPattern:
    """An Assay tool pattern (evidence-formats.md §2.6): exact, prefix*, *suffix, *substring*."""

    text: str

    @property
    def exact_value(self) -> str | None:
        # Without a leading or trailing star the pattern is one literal name.
        if self.text.startswith("*") or self.text.endswith("*"):
            return None
        return self.text

    def matches(self, value: str) -> bool:
        return matches_tool_pattern(self.text, value)


@dataclass(frozen=True, slots=True)
class OutsidePattern:
    """Matches every tool that none of ``inside`` matches (the allowlist gate, the no-schema gate)."""

    text: str
    inside: tuple[ToolPattern, ...]

    @property
    def exact_value(self) -> str | None:
        return None

    def matches(self, value: str) -> bool:
        for pattern in self.inside:
            if pattern.matches(value):
                return False
        return True


def _fail(source: Any, line: int | None, problem: str) -> Exception:

    return PolicyLoadError(source.shown, line, f"Assay-format policy: {problem}")


def _line_of(root: CommentedMap, *paths: tuple[str, ...]) -> int:
    """Line of the first of ``paths`` present in the file (1-based), else 1."""
    for path in paths:
        node: Any = root
        line = None
        for key in path:
            if not isinstance(node, CommentedMap) or key not in node:
                line = None
                break
            line = int(node.lc.key(key)[0]) + 1
            node = node[key]
        if line is not None:
            return line
    return 1


def _class_tools(classes: list[str] | None, tool_classes: Mapping[str, list[str]]) -> list[str]:
    """Tools whose declared classes meet ``classes`` (Assay looks classes up by exact tool name)."""
    if not classes:
        return []
    wanted = set(classes)
    return sorted(tool for tool, have in tool_classes.items() if wanted & set(have))


def _prepared_schema(schemas: Mapping[str, Any], tool: str) -> Any:
    """Assay's ``prepare_tool_schema``: merge the shared ``$defs`` into the tool's schema."""
    schema = schemas[tool]
    shared = schemas.get("$defs")
    if shared is None:
        return schema
    if not isinstance(shared, dict):
        raise SchemaLoadError("shared $defs must be a mapping")
    if isinstance(schema, dict):
        local = schema.get("$defs")
        if local is None:
            return {**schema, "$defs": dict(shared)}
        if not isinstance(local, dict):
            raise SchemaLoadError("tool-local $defs must be a mapping")
        if set(local) & set(shared):
            raise SchemaLoadError("shared and tool-local $defs entries must not overlap")
        return {**schema, "$defs": {**local, **shared}}
    return schema


def convert_assay_policy(source: Any, root: CommentedMap) -> Policy:
    """An Assay-format file as a native ``Policy``; ``root`` is its round-trip parse (for lines)."""
    unknown = unknown_policy_fields(root)
    if unknown:
        first = unknown[0]
        line = _line_of(root, tuple(first.split(".", 1)) if first.startswith("tools.") else (first,))
        raise _fail(source, line, f"unknown key `{first}`")
    try:
        policy = parse_assay_policy(source.text)
    except AssayPolicyError as exc:
        where = ""
        if exc.path:
            where = ".".join(str(p) for p in exc.path) + ": "
        raise _fail(source, exc.line, f"{where}{exc.message}") from None

    tools: Mapping[str, Any] = policy["tools"]
    tool_classes: Mapping[str, list[str]] = policy.get("tool_classes") or {}
    schemas_raw: Mapping[str, Any] = policy["schemas"]
    rules: list[Rule] = []

    def add(patterns: list[ToolPattern], action: Action, line: int) -> None:
        rules.append(Rule(len(rules), line, tuple(patterns), action, ()))

    deny: list[ToolPattern] = [AssayPattern(p) for p in tools.get("deny", [])]
    deny += [AssayPattern(t) for t in _class_tools(tools.get("deny_classes"), tool_classes)]
    if deny:
        add(deny, Action.DENY, _line_of(root, ("tools", "deny"), ("deny",), ("tools", "deny_classes")))

    if "allow" in tools or "allow_classes" in tools:
        allowed: list[ToolPattern] = [AssayPattern(p) for p in tools.get("allow", [])]
        allowed += [AssayPattern(t) for t in _class_tools(tools.get("allow_classes"), tool_classes)]
        add(
            [OutsidePattern("(not in the allowlist)", tuple(allowed))],
            Action.DENY,
            _line_of(root, ("tools", "allow"), ("allow",), ("tools", "allow_classes")),
        )

    schema_names = sorted(k for k in schemas_raw if k != "$defs")
    if policy["enforcement"]["unconstrained_tools"] == "deny":
        add(
            [OutsidePattern("(no schema)", tuple(AssayPattern(n) for n in schema_names))],
            Action.DENY,
            _line_of(root, ("enforcement", "unconstrained_tools"), ("enforcement",)),
        )

    approval: list[ToolPattern] = [AssayPattern(p) for p in tools.get("approval_required", [])]
    approval += [
        AssayPattern(t) for t in _class_tools(tools.get("approval_required_classes"), tool_classes)
    ]
    if approval:
        add(
            approval,
            Action.HUMAN_APPROVAL,
            _line_of(root, ("tools", "approval_required"), ("tools", "approval_required_classes")),
        )

    add([compile_glob("*")], Action.ALLOW, _line_of(root, ("enforcement",), ("tools",), ("version",)))

    schemas: dict[str, ToolSchema] = {}
    for name in schema_names:
        line = _line_of(root, ("schemas", name), ("constraints",))
        try:
            schemas[name] = compile_schema(name, _prepared_schema(schemas_raw, name), line)
        except SchemaLoadError as exc:
            raise _fail(source, line, f"schema for tool {name!r}: {exc}") from None

    name = policy.get("name") or _stem(source.name)
    return Policy(
        name=name,
        agent=compile_glob("*"),
        rules=tuple(rules),
        schemas=schemas,
        source_file=source.name,
        line=_line_of(root, ("name",), ("version",)),
        description="converted from an Assay-format policy",
        assay_policy=policy,
    )


def _stem(name: str) -> str:
    """A file name without its folders and its last suffix (``pathlib.PurePath.stem``, without I/O imports)."""
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return base[:dot] if 0 < dot < len(base) - 1 else base
