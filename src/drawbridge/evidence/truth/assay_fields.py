"""The fields of Assay's ``McpPolicy``: a JSON value checked against their types (evidence-formats.md §4).

Invariant: what leaves ``Checker.read`` holds each field of the format in the type Assay's
deserializer gives it; a wrong type is a ``structure`` error, as a serde failure is there, located
at the field's line and column when the value was read from text. A field the format does not
know is ignored, never taken.

Theory of operation. ``Checker.read`` copies the known fields into a ``CheckedPolicy``: the ten
``tools`` lists (``TOOL_LIST_FIELDS``) and the scope and redaction contracts, the legacy root
``allow``/``deny``, ``schemas``, the legacy ``constraints`` in their list shape ``[{tool, params:
{arg: {matches}}}]`` or their map shape ``{tool: {arg: regex | {matches}}}`` (map tools in sorted
order), and ``enforcement.unconstrained_tools`` (``UNCONSTRAINED_MODES``). Unknown fields are
ignored, as Assay ignores them after a warning (``unknown_policy_fields`` lists them). Operational
sections outside the declared surface (``discovery``, ``runtime_monitor``, ``kill_switch``) are
only checked to be mappings, limits, signatures, tool pins and tool classes to hold their types;
they never reach a digest or a verdict. ``Checker.validate_loaded`` is the file reading's
load-time check: tool-pin hashes are 64 lowercase hex, and kill-switch triggers name existing
monitor rules.

Where serde would also accept a struct written as a positional list (e.g. a constraint ``params``
entry as ``["^x$"]``), we refuse: that spelling is an accident of the reference's deserializer,
not part of the format.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from drawbridge.evidence.truth.assay_errors import AssayPolicyError, Path

__all__ = [
    "TOOL_LIST_FIELDS",
    "UNCONSTRAINED_MODES",
    "CheckedPolicy",
    "Checker",
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


@dataclass
class CheckedPolicy:
    """A policy's fields as checked, with the legacy lists and constraints still apart: the readings
    of ``assay_policy`` migrate them in place."""

    version: str = ""
    name: str = ""
    tools: dict[str, Any] = field(default_factory=dict)
    allow: list[str] | None = None
    deny: list[str] | None = None
    schemas: dict[str, Any] = field(default_factory=dict)
    constraints: list[tuple[str, dict[str, str | None]]] = field(default_factory=list)
    unconstrained_tools: str = "warn"
    operational: dict[str, Any] = field(default_factory=dict)


class Checker:
    """Checks a JSON value's fields, failing at the line and column ``positions`` holds for the
    field (none for a value that was never text)."""

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

    def read(self, raw: Any) -> CheckedPolicy:
        if not isinstance(raw, Mapping):
            raise AssayPolicyError(
                f"policy root is not a mapping (found {_type_name(raw)})", kind="root_not_mapping"
            )
        root = self.mapping(raw, ())
        policy = CheckedPolicy()
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

    def validate_loaded(self, policy: CheckedPolicy) -> None:
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


def unknown_policy_fields(policy: Mapping[str, Any]) -> tuple[str, ...]:
    """Root and ``tools`` keys the format does not know (ignored by the reading, worth a warning)."""
    unknown = [str(key) for key in policy if key not in _ROOT_FIELDS]
    tools = policy.get("tools")
    if isinstance(tools, Mapping):
        unknown += ["tools." + str(key) for key in tools if key not in _TOOLS_FIELDS]
    return tuple(unknown)
