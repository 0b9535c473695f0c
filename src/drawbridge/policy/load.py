"""Strict loading of policy text into the model.

Invariant: text becomes a ``Policy`` only if every key is known, every action
is one of allow / deny / human_approval, every glob, condition, regex and JSON
Schema compiles, and every value is plain JSON. Anything else raises
``PolicyLoadError(file, line, problem)``, whose text is ``file:line: problem``.
Nothing is guessed, defaulted or skipped with a warning.

Theory of operation. This module is pure: it takes text (the shell in
``state.policy_files`` reads the files) and reads it with ``strict_yaml`` (ruamel.yaml's
round-trip loader, which keeps the line of every key and item; duplicate keys, custom tags, values
that are not plain JSON and text that nests or expands past its bounds are refused there, one reading
shared with the configuration and the tables of ``policy test``). Each level is checked
against a table of allowed keys, then compiled through ``globs``,
``conditions`` and ``schemas``. ``load_policies`` loads several files (one
policy each), sorted by file name, refuses duplicate policy names, and orders
the result by agent specificity (``PolicySet.from_policies``). A file with
neither ``agent`` nor ``rules`` but with Assay's top-level keys is an
Assay-format policy and goes through ``policy.assay`` instead, when it is
read as a single file; in a policy directory it is a load error (it would
apply to every agent, beside the directory's own policies).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarbool import ScalarBoolean

from drawbridge.policy.conditions import ConditionError, compile_condition
from drawbridge.policy.errors import PolicyLoadError
from drawbridge.policy.globs import Glob, GlobError, compile_glob, compile_tool_glob
from drawbridge.policy.model import Action, Approver, Condition, Policy, PolicySet, Rule, ToolSchema
from drawbridge.policy.schemas import SchemaLoadError, compile_schema
from drawbridge.policy.strict_yaml import YamlProblem, read_yaml
from drawbridge.policy.strict_yaml import item_line as _item_line
from drawbridge.policy.strict_yaml import key_line as _key_line
from drawbridge.policy.strict_yaml import node_line as _line
from drawbridge.policy.strict_yaml import value_line as _value_line

POLICY_KEYS = ("name", "agent", "description", "rules", "schemas")
RULE_KEYS = ("tools", "action", "when", "approval", "memory_key")
CONDITION_KEYS = ("arg", "op", "value", "if_missing")

#: Top-level keys of Assay's McpPolicy (evidence-formats.md §4.2): a file with some of
#: these and without ``agent``/``rules`` is read as an Assay-format policy.
ASSAY_KEYS = frozenset(
    {
        "version",
        "tools",
        "allow",
        "deny",
        "constraints",
        "enforcement",
        "limits",
        "signatures",
        "tool_pins",
        "tool_classes",
        "discovery",
        "runtime_monitor",
        "kill_switch",
    }
)

_HINTS = {
    "condition": "mesh7's single `condition: {field, operator, value}` is written here as "
    "`when: [{arg: ..., op: ..., value: ...}]`",
    "conditions": "conditions are written `when: [{arg: ..., op: ..., value: ...}]`",
    "rate_limit": "rate limits are not part of a drawbridge policy",
    "field": "the argument is named with `arg`",
    "operator": "the operator is named with `op`",
}


@dataclass(frozen=True, slots=True)
class PolicySource:
    """One policy file's text. ``name`` becomes ``source_file``; ``path`` is shown in errors."""

    name: str
    text: str
    path: str | None = None
    in_directory: bool = False
    """Read from a policy directory: every file there is a native policy (Assay format is one file's)."""

    @property
    def shown(self) -> str:
        return self.path or self.name


class _Ctx:
    """Where we are, for error messages."""

    __slots__ = ("file",)

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, line: int | None, problem: str) -> PolicyLoadError:
        return PolicyLoadError(self.file, line, problem)


# ----------------------------------------------------------------------------- YAML helpers


def parse_yaml(text: str, file: str) -> Any:
    """The strict reading (``strict_yaml``: lines kept, values plain JSON, bounded); its problems
    become PolicyLoadError."""
    try:
        return read_yaml(text)
    except YamlProblem as exc:
        raise PolicyLoadError(file, exc.line, exc.problem) from None


def to_json(node: Any, ctx: _Ctx, line: int) -> Any:
    """Plain JSON values from ruamel's node types; anything not JSON is a load error."""
    if isinstance(node, CommentedMap) or isinstance(node, dict):
        out: dict[str, Any] = {}
        for key in node:
            kline = _key_line(node, key) if isinstance(node, CommentedMap) else line
            if not isinstance(key, str):
                raise ctx.fail(kline, f"mapping key {key!r} is not a string")
            vline = _value_line(node, key) if isinstance(node, CommentedMap) else kline
            out[str(key)] = to_json(node[key], ctx, vline)
        return out
    if isinstance(node, (CommentedSeq, list)):
        return [
            to_json(item, ctx, _item_line(node, i, line) if isinstance(node, CommentedSeq) else line)
            for i, item in enumerate(node)
        ]
    if node is None or isinstance(node, bool):
        return node
    if isinstance(node, ScalarBoolean):
        return bool(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        value = float(node)
        if not math.isfinite(value):
            raise ctx.fail(line, "a number must be finite (.inf and .nan are not JSON)")
        return value
    raise ctx.fail(line, f"a value of YAML type {type(node).__name__} is not plain JSON")


def json_value(node: Any, file: str, line: int) -> Any:
    """``to_json`` for a reader of other files of the same format (the tables of ``policy test``)."""
    return to_json(node, _Ctx(file), line)


def _check_keys(node: CommentedMap, allowed: tuple[str, ...], what: str, ctx: _Ctx) -> None:
    for key in node:
        if not isinstance(key, str):
            raise ctx.fail(_key_line(node, key), f"{what} key {key!r} is not a string")
        if key not in allowed:
            hint = _HINTS.get(key)
            problem = f"unknown key `{key}` in {what} (allowed: {', '.join(allowed)})"
            if hint:
                problem += f"; {hint}"
            raise ctx.fail(_key_line(node, key), problem)


def _require(node: CommentedMap, key: str, what: str, ctx: _Ctx) -> Any:
    if key not in node:
        raise ctx.fail(_line(node), f"{what} is missing required key `{key}`")
    return node[key]


def _string(value: Any, what: str, line: int, ctx: _Ctx) -> str:
    if not isinstance(value, str) or value == "":
        raise ctx.fail(line, f"{what} must be a non-empty string")
    text = str(value)
    if not text.isprintable():
        raise ctx.fail(line, f"{what} contains a control or format character")
    return text


# ----------------------------------------------------------------------------- native format


def _condition(node: Any, line: int, ctx: _Ctx) -> Condition:
    if not isinstance(node, CommentedMap):
        raise ctx.fail(line, "each entry of `when` must be a mapping {arg, op, value}")
    line = _line(node, line)
    _check_keys(node, CONDITION_KEYS, "condition", ctx)
    raw_arg = _require(node, "arg", "condition", ctx)
    op = _require(node, "op", "condition", ctx)
    if "value" not in node:
        raise ctx.fail(line, "condition is missing required key `value`")
    arg_line = _key_line(node, "arg")
    if isinstance(raw_arg, str):
        path = tuple(str(raw_arg).split("."))
        if any(part == "" for part in path):
            raise ctx.fail(arg_line, f"`arg` {str(raw_arg)!r} has an empty path segment")
    elif isinstance(raw_arg, CommentedSeq) and raw_arg and all(isinstance(p, str) for p in raw_arg):
        path = tuple(str(p) for p in raw_arg)
    else:
        raise ctx.fail(arg_line, "`arg` must be an argument name, a dotted path, or a list of keys")
    if not isinstance(op, str):
        raise ctx.fail(_key_line(node, "op"), "`op` must be a string")
    value = to_json(node["value"], ctx, _value_line(node, "value"))
    if_missing = None
    if "if_missing" in node:
        if_missing = to_json(node["if_missing"], ctx, _value_line(node, "if_missing"))
        if not isinstance(if_missing, bool):
            raise ctx.fail(_key_line(node, "if_missing"), "`if_missing` must be true or false")
    try:
        return compile_condition(path, str(op), value, if_missing, line)
    except ConditionError as exc:
        raise ctx.fail(line, f"bad condition on `{'.'.join(path)}`: {exc}") from None


def _rule(node: Any, index: int, line: int, ctx: _Ctx) -> Rule:
    if not isinstance(node, CommentedMap):
        raise ctx.fail(line, f"rule {index} must be a mapping with `tools` and `action`")
    line = _line(node, line)
    _check_keys(node, RULE_KEYS, "rule", ctx)
    tools = _require(node, "tools", f"rule {index}", ctx)
    tools_line = _value_line(node, "tools")
    if not isinstance(tools, CommentedSeq) or not tools:
        raise ctx.fail(tools_line, "`tools` must be a non-empty list of globs")
    patterns = []
    for i, text in enumerate(tools):
        item_line = _item_line(tools, i, tools_line)
        if not isinstance(text, str):
            raise ctx.fail(item_line, "each entry of `tools` must be a string (a glob)")
        try:
            patterns.append(compile_tool_glob(str(text)))
        except GlobError as exc:
            raise ctx.fail(item_line, f"bad glob {str(text)!r} in `tools`: {exc}") from None
    action_text = _require(node, "action", f"rule {index}", ctx)
    try:
        action = Action(action_text) if isinstance(action_text, str) else None
    except ValueError:
        action = None
    if action is None:
        allowed = ", ".join(a.value for a in Action)
        raise ctx.fail(_value_line(node, "action"), f"unknown action {action_text!r} (allowed: {allowed})")
    conditions: tuple[Condition, ...] = ()
    if "when" in node:
        when = node["when"]
        when_line = _value_line(node, "when")
        if not isinstance(when, CommentedSeq) or not when:
            raise ctx.fail(when_line, "`when` must be a non-empty list of conditions")
        conditions = tuple(_condition(c, _item_line(when, i, when_line), ctx) for i, c in enumerate(when))
    approver, memory_key = _approval_terms(node, action, ctx)
    return Rule(index, line, tuple(patterns), action, conditions, approver, memory_key)


def _approval_terms(node: CommentedMap, action: Action, ctx: _Ctx) -> tuple[Approver, tuple[tuple[str, ...], ...]]:
    """A ``human_approval`` rule's ``approval`` (who may approve) and ``memory_key`` (what memory also
    matches on); on any other rule they would say nothing, so they are refused there."""
    for key in ("approval", "memory_key"):
        if key in node and action is not Action.HUMAN_APPROVAL:
            raise ctx.fail(_key_line(node, key), f"`{key}` applies to human_approval rules only")
    approver = Approver.ANY
    if "approval" in node:
        text = node["approval"]
        try:
            approver = Approver(text) if isinstance(text, str) else None  # type: ignore[assignment]
        except ValueError:
            approver = None  # type: ignore[assignment]
        if approver is None:
            allowed = ", ".join(a.value for a in Approver)
            raise ctx.fail(_value_line(node, "approval"), f"unknown approval {text!r} (allowed: {allowed})")
    paths: list[tuple[str, ...]] = []
    if "memory_key" in node:
        raw = node["memory_key"]
        line = _value_line(node, "memory_key")
        if not isinstance(raw, CommentedSeq) or not raw:
            raise ctx.fail(line, "`memory_key` must be a non-empty list of argument names or dotted paths")
        for i, item in enumerate(raw):
            item_line = _item_line(raw, i, line)
            if not isinstance(item, str) or not item or any(part == "" for part in str(item).split(".")):
                raise ctx.fail(item_line, "each entry of `memory_key` must be an argument name or a dotted path")
            paths.append(tuple(str(item).split(".")))
        if approver is Approver.OPERATOR:
            raise ctx.fail(line, "`memory_key` has no use with `approval: operator`: approval memory never applies")
    return approver, tuple(paths)


_GLOB_META = frozenset("*?[")


def _schemas(node: Any, line: int, ctx: _Ctx) -> dict[str, ToolSchema]:
    if not isinstance(node, CommentedMap):
        raise ctx.fail(line, "`schemas` must be a mapping from tool name to JSON Schema")
    out: dict[str, ToolSchema] = {}
    for tool in node:
        kline = _key_line(node, tool)
        name = _string(tool, "a `schemas` key", kline, ctx)
        if _GLOB_META & set(name):
            raise ctx.fail(kline, f"`schemas` keys are exact tool names; {name!r} looks like a glob")
        schema = to_json(node[tool], ctx, _value_line(node, tool))
        try:
            out[name] = compile_schema(name, schema, kline)
        except SchemaLoadError as exc:
            raise ctx.fail(kline, f"schema for tool {name!r}: {exc}") from None
    return out


def agent_glob(text: str) -> Glob:
    """A policy's ``agent`` glob (also ``discover --agent``, so that a draft it writes loads): not
    empty, printable as ``name`` is, well formed."""
    if text and not text.isprintable():
        raise GlobError("contains a control or format character")
    return compile_glob(text)


def _native(root: CommentedMap, source: PolicySource, ctx: _Ctx) -> Policy:
    _check_keys(root, POLICY_KEYS, "policy", ctx)
    name = _string(_require(root, "name", "policy", ctx), "`name`", _value_line(root, "name"), ctx)
    agent_text = _require(root, "agent", "policy", ctx)
    agent_line = _value_line(root, "agent")
    agent_text = _string(agent_text, "`agent`", agent_line, ctx)
    try:
        agent = agent_glob(agent_text)
    except GlobError as exc:
        raise ctx.fail(agent_line, f"bad agent glob {agent_text!r}: {exc}") from None
    description = None
    if "description" in root:
        description = _string(root["description"], "`description`", _value_line(root, "description"), ctx)
    rules_node = _require(root, "rules", "policy", ctx)
    rules_line = _value_line(root, "rules")
    if not isinstance(rules_node, CommentedSeq):
        raise ctx.fail(rules_line, "`rules` must be a list")
    rules = tuple(_rule(r, i, _item_line(rules_node, i, rules_line), ctx) for i, r in enumerate(rules_node))
    schemas = _schemas(root["schemas"], _value_line(root, "schemas"), ctx) if "schemas" in root else {}
    return Policy(
        name=name,
        agent=agent,
        rules=rules,
        schemas=schemas,
        source_file=source.name,
        line=_key_line(root, "name"),
        description=description,
    )


def is_assay_format(root: Any) -> bool:
    """Neither ``agent`` nor ``rules``, and at least one of Assay's top-level keys."""
    if not isinstance(root, CommentedMap):
        return False
    keys = {k for k in root if isinstance(k, str)}
    return "agent" not in keys and "rules" not in keys and bool(keys & ASSAY_KEYS)


def parse_policy(source: PolicySource) -> Policy:
    """One policy file into a ``Policy`` (strict); an Assay-format file is converted."""
    try:
        return _parse(source)
    except RecursionError:
        raise PolicyLoadError(source.shown, None, "the file nests too deeply") from None


def _parse(source: PolicySource) -> Policy:
    ctx = _Ctx(source.shown)
    root = parse_yaml(source.text, source.shown)
    if root is None:
        raise ctx.fail(1, "the file is empty; expected a policy with `name`, `agent` and `rules`")
    if not isinstance(root, CommentedMap):
        raise ctx.fail(_line(root), "the top level must be a mapping with `name`, `agent` and `rules`")
    if is_assay_format(root):
        if source.in_directory:
            first = next(k for k in root if isinstance(k, str) and k in ASSAY_KEYS)
            raise ctx.fail(
                _key_line(root, first),
                f"an Assay-format policy (`{first}`, no `agent` or `rules`) is read only as a single file "
                "(--policy FILE, policy_file), never from a policy directory, where it would apply to every "
                "agent; give it `name`, `agent` and `rules`, or move it out of the directory",
            )
        from drawbridge.policy.assay import convert_assay_policy

        return convert_assay_policy(source, root)
    return _native(root, source, ctx)


def load_policies(sources: Iterable[PolicySource]) -> PolicySet:
    """Several policy files (e.g. a ``policy_dir``) into one ordered ``PolicySet``.

    Files are taken in file-name order (code-point order), which is also the
    tie-break between equally specific agent globs.
    """
    ordered = sorted(sources, key=lambda s: s.name)
    seen: dict[str, str] = {}
    policies: list[Policy] = []
    for source in ordered:
        policy = parse_policy(source)
        if policy.name in seen:
            raise PolicyLoadError(
                source.shown,
                policy.line,
                f"duplicate policy name {policy.name!r} (also in {seen[policy.name]})",
            )
        seen[policy.name] = source.shown
        policies.append(policy)
    return PolicySet.from_policies(policies)


def load_policy_text(text: str, name: str = "<policy>", path: str | None = None) -> PolicySet:
    """A single policy file (native or Assay format) into a ``PolicySet``."""
    return load_policies([PolicySource(name, text, path)])
