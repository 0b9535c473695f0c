"""Assay-format MCP policies read the way the reference reads them (evidence-formats.md 4, 2.5).

Invariant: a policy that reaches the truth layer has been through exactly one of
the two readings the reference has, and we say which:

* ``parse_assay_policy(text)`` is the *file* reading (Assay's ``from_file`` /
  ``from_slice``, used by its live producer). Legacy root ``allow``/``deny`` are
  appended to ``tools.allow``/``tools.deny``, and **non-empty** legacy
  ``constraints`` are migrated at load with a plain insert, so a migrated schema
  *overwrites* an explicit schema for the same tool (the 2.5 caveat, reproduced on
  purpose: the declared digest of a file must equal Assay's for the same file).
* ``normalize_assay_policy(policy)`` is the *declared view* of an already-parsed
  dict (Assay's ``normalized_declared_view_experimental`` over a policy built with
  ``serde_json::from_value``, as its conformance vectors are). Legacy shapes are
  merged, migration always runs, and an explicit schema wins over a migrated one.

Both return the same plain-dict shape, and the declared view of a file reading is
the file reading's own normalization, so ``normalize_assay_policy(parse_assay_policy(t))``
is what Assay's producer digests and evaluates for the file ``t``.

Theory of operation.

1. Text -> JSON value. YAML (JSON is YAML) is composed with ruamel.yaml's safe
   loader into nodes and converted by us, so we control what a scalar means and
   keep a line/column for every path. Refused, with the line: several documents,
   duplicate keys, non-string keys, merge keys (``<<``), tags other than the
   core ones, recursive aliases, non-finite numbers, and numeric spellings whose
   meaning differs between YAML readers (``1_000``, ``012``, ``0b1``): quote them
   or write them plainly. A plain scalar that looks like a date stays a string,
   as in Assay's reader.
2. JSON value -> checked policy. The field types of Assay's ``McpPolicy`` are
   enforced (a wrong type is a ``structure`` error, as a serde failure is there);
   unknown fields are ignored, as Assay ignores them after a warning
   (``unknown_policy_fields`` lists them). Operational sections outside the
   declared surface (``discovery``, ``runtime_monitor``, ``kill_switch``) are only
   checked to be mappings; they never reach a digest or a verdict.
3. Legacy shapes. Root ``allow``/``deny`` are appended after the ``tools`` lists,
   creating the list if absent and keeping duplicates. Constraints come in a
   list shape ``[{tool, params: {arg: {matches}}}]`` or a map shape
   ``{tool: {arg: regex | {matches}}}`` (map tools in sorted order); each becomes
   ``{"type":"object","additionalProperties":true,"properties":{arg:{"type":"string",
   "pattern":regex,"minLength":1}},"required":[args in sorted order]}``, params
   without ``matches`` skipped. A version of ``""`` or ``"1.0"`` becomes ``"2.0"``
   whenever migration runs.
4. The file reading then validates what Assay validates at load: tool-pin hashes
   are 64 lowercase hex, and kill-switch triggers name existing monitor rules.

Where serde would also accept a struct written as a positional list (e.g. a
constraint ``params`` entry as ``["^x$"]``), we refuse: that spelling is an
accident of the reference's deserializer, not part of the format.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "TOOL_LIST_FIELDS",
    "UNCONSTRAINED_MODES",
    "AssayPolicyError",
    "normalize_assay_policy",
    "parse_assay_policy",
    "unknown_policy_fields",
]

#: The ten ``tools`` lists of the declared surface, in the reference's order.
TOOL_LIST_FIELDS: tuple[str, ...] = (
    "allow",
    "deny",
    "allow_classes",
    "deny_classes",
    "approval_required",
    "approval_required_classes",
    "restrict_scope",
    "restrict_scope_classes",
    "redact_args",
    "redact_args_classes",
)

#: ``enforcement.unconstrained_tools`` values; the first is the default.
UNCONSTRAINED_MODES: tuple[str, ...] = ("warn", "deny", "allow")

_CONTRACT_FIELDS: dict[str, tuple[str, ...]] = {
    "restrict_scope_contract": ("scope_type", "scope_value", "scope_match_mode"),
    "redact_args_contract": ("redaction_target", "redaction_mode", "redaction_scope"),
}
_TOOLS_FIELDS = frozenset(TOOL_LIST_FIELDS) | frozenset(_CONTRACT_FIELDS)
_OPERATIONAL_FIELDS = (
    "limits",
    "signatures",
    "tool_pins",
    "tool_classes",
    "discovery",
    "runtime_monitor",
    "kill_switch",
)
_ROOT_FIELDS = frozenset(
    ("version", "name", "tools", "allow", "deny", "schemas", "constraints", "enforcement")
) | frozenset(_OPERATIONAL_FIELDS)
_PIN_FIELDS = ("server_id", "tool_name", "schema_hash", "meta_hash")
_HEX64 = re.compile(r"[0-9a-f]{64}")

Path = tuple[str | int, ...]


class AssayPolicyError(ValueError):
    """An Assay-format policy that cannot be read; the gateway refuses to start on it.

    ``kind`` is one of ``syntax`` (not YAML/JSON), ``root_not_mapping``,
    ``structure`` (a field of the wrong type or shape), ``validation`` (the
    file reading's load-time checks) or ``deprecated`` (a v1 policy when
    deprecations are denied). ``line``/``column`` are 1-based when known. The
    message names the field and the type found, never a value from the policy.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        path: Path = (),
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.kind = kind
        self.path = path
        self.line = line
        self.column = column
        self.message = message
        where = []
        if line is not None:
            where.append(f"line {line}" + (f", column {column}" if column is not None else ""))
        if path:
            where.append(_format_path(path))
        super().__init__(": ".join([*where, message]))


def _format_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += ("." if out else "") + part
        else:
            out += "[" + repr(part) + "]"
    return out


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return "a " + type(value).__name__


# --- 1. text -> JSON value ------------------------------------------------------------------

_INT_DEC = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_INT_HEX = re.compile(r"0x[0-9a-fA-F]+")
_INT_OCT = re.compile(r"0o[0-7]+")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
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
        if tag == _TAG + "int":
            if _INT_DEC.fullmatch(text):
                return int(text)
            if _INT_HEX.fullmatch(text):
                return int(text[2:], 16)
            if _INT_OCT.fullmatch(text):
                return int(text[2:], 8)
            self.fail(node, "ambiguous integer spelling; write it plainly or quote it", path)
        if tag == _TAG + "float":
            if _FLOAT.fullmatch(text):
                number = float(text)
                if math.isfinite(number):
                    return number
            self.fail(node, "number is not a finite JSON number", path)
        self.fail(node, "unsupported tag on a scalar", path)


def _load_text(text: str | bytes) -> tuple[Any, dict[Path, tuple[int, int]]]:
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


# --- 2. JSON value -> checked policy --------------------------------------------------------


@dataclass
class _Policy:
    version: str = ""
    name: str = ""
    tools: dict[str, Any] = field(default_factory=dict)
    allow: list[str] | None = None
    deny: list[str] | None = None
    schemas: dict[str, Any] = field(default_factory=dict)
    constraints: list[tuple[str, dict[str, str | None]]] = field(default_factory=list)
    unconstrained_tools: str = "warn"
    operational: dict[str, Any] = field(default_factory=dict)


class _Checker:
    def __init__(self, positions: Mapping[Path, tuple[int, int]]) -> None:
        self.positions = positions

    def fail(self, path: Path, message: str, kind: str = "structure") -> NoReturn:
        line, column = self.positions.get(path, (None, None))
        raise AssayPolicyError(message, kind=kind, path=path, line=line, column=column)

    def mapping(self, value: Any, path: Path) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, found {_type_name(value)}")
        for key in value:
            if not isinstance(key, str):
                self.fail(path, f"mapping keys must be strings, found {_type_name(key)}")
        return dict(value)

    def string(self, value: Any, path: Path) -> str:
        if not isinstance(value, str):
            self.fail(path, f"expected a string, found {_type_name(value)}")
        return value

    def boolean(self, value: Any, path: Path) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected a boolean, found {_type_name(value)}")
        return value

    def string_list(self, value: Any, path: Path) -> list[str]:
        if not isinstance(value, (list, tuple)):
            self.fail(path, f"expected a list of strings, found {_type_name(value)}")
        return [self.string(item, (*path, i)) for i, item in enumerate(value)]

    def optional_string_list(self, value: Any, path: Path) -> list[str] | None:
        return None if value is None else self.string_list(value, path)

    def read(self, raw: Any) -> _Policy:
        if not isinstance(raw, Mapping):
            raise AssayPolicyError(
                f"policy root is not a mapping (found {_type_name(raw)})", kind="root_not_mapping"
            )
        root = self.mapping(raw, ())
        policy = _Policy()
        if "version" in root:
            policy.version = self._version(root["version"])
        if "name" in root:
            policy.name = self.string(root["name"], ("name",))
        if "tools" in root:
            policy.tools = self._tools(root["tools"], ("tools",))
        policy.allow = self.optional_string_list(root.get("allow"), ("allow",))
        policy.deny = self.optional_string_list(root.get("deny"), ("deny",))
        if "schemas" in root:
            policy.schemas = copy.deepcopy(self.mapping(root["schemas"], ("schemas",)))
        policy.constraints = self._constraints(root.get("constraints"), ("constraints",))
        if "enforcement" in root:
            policy.unconstrained_tools = self._enforcement(root["enforcement"], ("enforcement",))
        policy.operational = self._operational(root)
        return policy

    def _version(self, value: Any) -> str:
        if not isinstance(value, str):
            self.fail(("version",), f"expected a string (quote it, e.g. \"2.0\"), found {_type_name(value)}")
        return value

    def _tools(self, value: Any, path: Path) -> dict[str, Any]:
        tools = self.mapping(value, path)
        out: dict[str, Any] = {}
        for key in TOOL_LIST_FIELDS:
            items = self.optional_string_list(tools.get(key), (*path, key))
            if items is not None:
                out[key] = items
        for key, required in _CONTRACT_FIELDS.items():
            contract = tools.get(key)
            if contract is None:
                continue
            contract = self.mapping(contract, (*path, key))
            checked: dict[str, str] = {}
            for name in required:
                if name not in contract:
                    self.fail((*path, key), f"missing field {name!r}")
                checked[name] = self.string(contract[name], (*path, key, name))
            out[key] = checked
        return out

    def _enforcement(self, value: Any, path: Path) -> str:
        settings = self.mapping(value, path)
        if "unconstrained_tools" not in settings:
            return UNCONSTRAINED_MODES[0]
        mode = settings["unconstrained_tools"]
        if not isinstance(mode, str) or mode not in UNCONSTRAINED_MODES:
            self.fail(
                (*path, "unconstrained_tools"),
                "expected one of " + "|".join(UNCONSTRAINED_MODES) + f", found {_type_name(mode)}"
                + (" outside that set" if isinstance(mode, str) else ""),
            )
        return mode

    def _param(self, value: Any, path: Path, *, direct_string: bool) -> str | None:
        if direct_string and isinstance(value, str):
            return value
        if not isinstance(value, Mapping):
            expected = "a regex string or a mapping with 'matches'" if direct_string else "a mapping"
            self.fail(path, f"expected {expected}, found {_type_name(value)}")
        param = self.mapping(value, path)
        matches = param.get("matches")
        return None if matches is None else self.string(matches, (*path, "matches"))

    def _constraints(self, value: Any, path: Path) -> list[tuple[str, dict[str, str | None]]]:
        if value is None:
            return []
        if isinstance(value, (list, tuple)):
            rules: list[tuple[str, dict[str, str | None]]] = []
            for i, rule in enumerate(value):
                rule_path = (*path, i)
                rule = self.mapping(rule, rule_path)
                for required in ("tool", "params"):
                    if required not in rule:
                        self.fail(rule_path, f"missing field {required!r} (list shape: {{tool, params}})")
                tool = self.string(rule["tool"], (*rule_path, "tool"))
                params_path = (*rule_path, "params")
                params = self.mapping(rule["params"], params_path)
                rules.append(
                    (
                        tool,
                        {
                            arg: self._param(spec, (*params_path, arg), direct_string=False)
                            for arg, spec in params.items()
                        },
                    )
                )
            return rules
        if isinstance(value, Mapping):
            by_tool = self.mapping(value, path)
            rules = []
            for tool in sorted(by_tool):
                params = self.mapping(by_tool[tool], (*path, tool))
                rules.append(
                    (
                        tool,
                        {
                            arg: self._param(spec, (*path, tool, arg), direct_string=True)
                            for arg, spec in params.items()
                        },
                    )
                )
            return rules
        self.fail(path, f"expected the list shape or the map shape, found {_type_name(value)}")

    def _operational(self, root: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in _OPERATIONAL_FIELDS:
            if key not in root:
                continue
            value = root[key]
            path: Path = (key,)
            if key in ("tool_pins", "tool_classes"):
                entries = self.mapping(value, path)
                for name, entry in entries.items():
                    if key == "tool_classes":
                        self.string_list(entry, (*path, name))
                        continue
                    pin = self.mapping(entry, (*path, name))
                    for pin_field in _PIN_FIELDS:
                        if pin_field not in pin:
                            self.fail((*path, name), f"missing field {pin_field!r}")
                        self.string(pin[pin_field], (*path, name, pin_field))
            elif value is not None:
                section = self.mapping(value, path)
                if key == "limits":
                    for limit in ("max_requests_total", "max_tool_calls_total"):
                        number = section.get(limit)
                        if number is not None and (
                            isinstance(number, bool) or not isinstance(number, int) or number < 0
                        ):
                            found = _type_name(number)
                            self.fail((*path, limit), f"expected a non-negative integer, found {found}")
                elif key == "signatures" and "check_descriptions" in section:
                    self.boolean(section["check_descriptions"], (*path, "check_descriptions"))
            out[key] = copy.deepcopy(value)
        return out

    def validate_loaded(self, policy: _Policy) -> None:
        """The file reading's load-time checks (pins, kill-switch references)."""
        pins = policy.operational.get("tool_pins") or {}
        for name in sorted(pins):
            for pin_field in ("schema_hash", "meta_hash"):
                if not _HEX64.fullmatch(pins[name][pin_field]):
                    self.fail(
                        ("tool_pins", name, pin_field),
                        "must be exactly 64 lowercase hexadecimal characters",
                        kind="validation",
                    )
        monitor = policy.operational.get("runtime_monitor")
        kill = policy.operational.get("kill_switch")
        if monitor is None or kill is None:
            return
        rules = monitor.get("rules", [])
        triggers = kill.get("triggers", [])
        if not isinstance(rules, list) or not isinstance(triggers, list):
            self.fail(("kill_switch",), "runtime_monitor.rules and kill_switch.triggers must be lists")
        rule_ids = set()
        for i, rule in enumerate(rules):
            rule = self.mapping(rule, ("runtime_monitor", "rules", i))
            rule_ids.add(self.string(rule.get("id"), ("runtime_monitor", "rules", i, "id")))
        for i, trigger in enumerate(triggers):
            trigger = self.mapping(trigger, ("kill_switch", "triggers", i))
            on_rule = self.string(trigger.get("on_rule"), ("kill_switch", "triggers", i, "on_rule"))
            if on_rule not in rule_ids:
                self.fail(
                    ("kill_switch", "triggers", i, "on_rule"),
                    "references an unknown runtime_monitor rule id",
                    kind="validation",
                )


# --- 3. legacy shapes -----------------------------------------------------------------------


def _merge_legacy_lists(policy: _Policy) -> None:
    for key in ("allow", "deny"):
        legacy = getattr(policy, key)
        if legacy is not None:
            policy.tools[key] = [*policy.tools.get(key, []), *legacy]
            setattr(policy, key, None)


def _constraint_schema(params: Mapping[str, str | None]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for arg in sorted(params):  # code-point order == the reference's byte order
        pattern = params[arg]
        if pattern is None:
            continue
        properties[arg] = {"type": "string", "pattern": pattern, "minLength": 1}
        required.append(arg)
    return {"type": "object", "additionalProperties": True, "properties": properties, "required": required}


def _migrate_constraints(policy: _Policy) -> None:
    """Insert one schema per constraint (later ones overwrite), then normalize the version."""
    for tool, params in policy.constraints:
        policy.schemas[tool] = _constraint_schema(params)
    policy.constraints = []
    if policy.version in ("", "1.0"):
        policy.version = "2.0"


def _public(policy: _Policy) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version": policy.version,
        "name": policy.name,
        "tools": policy.tools,
        "schemas": policy.schemas,
        "enforcement": {"unconstrained_tools": policy.unconstrained_tools},
    }
    out.update(policy.operational)
    return out


# --- public ---------------------------------------------------------------------------------


def parse_assay_policy(text: str | bytes, *, deny_deprecations: bool = False) -> dict[str, Any]:
    """Read an Assay policy file's text the way Assay's ``from_file`` does.

    File reading (see the module docstring): non-empty legacy constraints are
    migrated here and *overwrite* explicit schemas of the same tool, as in the
    reference, so a digest of this result equals Assay's digest of that file.
    ``deny_deprecations`` refuses v1 policies (constraints, or version
    ``"1.0"``), as Assay's ``--deny-deprecations`` does. Raises
    ``AssayPolicyError`` with a line and column where the text has one.
    """
    raw, positions = _load_text(text)
    checker = _Checker(positions)
    policy = checker.read(raw)
    if deny_deprecations and (policy.constraints or policy.version == "1.0"):
        raise AssayPolicyError(
            "v1 policy format (constraints or version \"1.0\") is refused: deprecations are denied",
            kind="deprecated",
        )
    _merge_legacy_lists(policy)
    if policy.constraints:
        _migrate_constraints(policy)
    checker.validate_loaded(policy)
    return _public(policy)


def normalize_assay_policy(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The normalized declared view of an already-parsed policy dict.

    Declared-view reading (see the module docstring): legacy lists merged,
    constraints always migrated, version normalized, and an explicit schema wins
    over a migrated one. Idempotent, and a fresh copy: the input is not touched.
    Both the declared digest and the verdict gate read a policy through this.
    """
    policy_ = _Checker({}).read(policy)
    _merge_legacy_lists(policy_)
    explicit = dict(policy_.schemas)
    _migrate_constraints(policy_)
    policy_.schemas.update(explicit)
    return _public(policy_)


def unknown_policy_fields(policy: Mapping[str, Any]) -> tuple[str, ...]:
    """Root and ``tools`` keys the format does not know (ignored by the reading, worth a warning)."""
    unknown = [str(key) for key in policy if key not in _ROOT_FIELDS]
    tools = policy.get("tools")
    if isinstance(tools, Mapping):
        unknown += ["tools." + str(key) for key in tools if key not in _TOOLS_FIELDS]
    return tuple(unknown)
