"""The ``result_guards`` list: which tools' results are redacted of secrets and held to a size, read
from serve's configuration or from the file ``wrap --result-guards`` names (one loader for both).

Invariant: an entry that loads has well-formed globs (the policy's rules, ``policy.globs``), a
``max_bytes`` between ``MIN_MAX_BYTES`` and ``MAX_MAX_BYTES`` when it has one, ``on_oversize`` and
``on_secret`` from their closed sets, and custom patterns that passed ``check_secret_regex`` under
names that cannot be confused with a built-in kind. Every problem is one located ``ConfigError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from drawbridge.config_reader import ConfigError, Reader, line_of
from drawbridge.policy.globs import Glob, GlobError, compile_glob, compile_tool_glob
from drawbridge.policy.regexes import RegexError
from drawbridge.policy.secret_patterns import BUILTIN_KINDS, KIND_NAME, Detector, check_secret_regex
from drawbridge.policy.strict_yaml import YamlProblem, read_yaml

MIN_MAX_BYTES: Final = 1024
"""The smallest size cap: room for the gateway's own notice of what it cut."""
MAX_MAX_BYTES: Final = 64 * 1024 * 1024
ON_OVERSIZE: Final = ("truncate", "refuse")
ON_SECRET: Final = ("redact", "refuse")
KEYS: Final = {"tools", "agents", "max_bytes", "on_oversize", "redact_secrets", "secret_patterns", "on_secret"}


@dataclass(frozen=True)
class ResultGuardRule:
    """One entry of ``result_guards``; ``index`` is its place in the list (named in notices and records)."""

    index: int
    tools: tuple[Glob, ...]
    agents: tuple[Glob, ...]
    max_bytes: int | None = None
    on_oversize: str = "truncate"
    redact_secrets: bool = False
    secret_patterns: tuple[Detector, ...] = ()
    on_secret: str = "redact"

    def matches(self, agent: str, tool: str) -> bool:
        return any(glob.matches(tool) for glob in self.tools) and any(glob.matches(agent) for glob in self.agents)

    @property
    def acts(self) -> bool:
        """The entry guards something (an entry that does nothing exempts its tools from later ones)."""
        return self.max_bytes is not None or self.redact_secrets or bool(self.secret_patterns)


def _globs(entry: Reader, key: str, tool: bool) -> tuple[Glob, ...]:
    value = entry.get(key, (CommentedSeq, list), default=["*"])
    if not value:
        raise entry.fail(key, f"{entry.where}.{key} is empty: it would match nothing (leave it out for every one)")
    globs = []
    for item in value:
        if not isinstance(item, str):
            raise entry.fail(key, f"{entry.where}.{key} must be a list of strings")
        try:
            globs.append(compile_tool_glob(item) if tool else compile_glob(item))
        except GlobError as exc:
            raise entry.fail(key, f"{entry.where}.{key}: glob {item!r} is not valid: {exc}") from None
    return tuple(globs)


def _patterns(entry: Reader) -> tuple[Detector, ...]:
    sub = entry.child("secret_patterns")
    if sub is None:
        return ()
    if not sub.node:  # an entry that guards nothing exempts its tools: never by an oversight
        raise entry.fail("secret_patterns", f"{sub.where} is empty")
    detectors = []
    for name, pattern in sub.node.items():
        if not isinstance(name, str) or not isinstance(pattern, str):
            raise sub.fail(name if isinstance(name, str) else None, f"{sub.where} must map names to regular expressions")
        if not KIND_NAME.fullmatch(name):
            raise sub.fail(name, f"{sub.where}: the name {name!r} must match {KIND_NAME.pattern} (it is a log field and a metric label)")
        if name in BUILTIN_KINDS:
            raise sub.fail(name, f"{sub.where}: {name!r} is the name of a built-in detector; choose another")
        try:
            detectors.append(Detector(name, check_secret_regex(pattern), windowed=True))
        except RegexError as exc:
            raise sub.fail(name, f"{sub.where}.{name}: the pattern {exc}") from None
    return tuple(detectors)


def _entry(file: str, node: Any, where: str, index: int) -> ResultGuardRule:
    entry = Reader(file, node, f"{where}[{index}]")
    entry.check_keys(KEYS)
    max_bytes = entry.get("max_bytes", int)
    if max_bytes is not None and not MIN_MAX_BYTES <= max_bytes <= MAX_MAX_BYTES:
        raise entry.fail("max_bytes", f"{entry.where}.max_bytes must be between {MIN_MAX_BYTES} and {MAX_MAX_BYTES}")
    on_oversize = entry.get("on_oversize", str, default="truncate")
    if on_oversize not in ON_OVERSIZE:
        raise entry.fail("on_oversize", f"{entry.where}.on_oversize must be truncate or refuse, not {on_oversize!r}")
    if "on_oversize" in entry.node and max_bytes is None:
        raise entry.fail("on_oversize", f"{entry.where}.on_oversize needs max_bytes")
    on_secret = entry.get("on_secret", str, default="redact")
    if on_secret not in ON_SECRET:
        raise entry.fail("on_secret", f"{entry.where}.on_secret must be redact or refuse, not {on_secret!r}")
    rule = ResultGuardRule(
        index=index, tools=_globs(entry, "tools", True), agents=_globs(entry, "agents", False),
        max_bytes=max_bytes, on_oversize=on_oversize, redact_secrets=entry.get("redact_secrets", bool, default=False),
        secret_patterns=_patterns(entry), on_secret=on_secret,
    )
    if "on_secret" in entry.node and not (rule.redact_secrets or rule.secret_patterns):
        raise entry.fail("on_secret", f"{entry.where}.on_secret needs redact_secrets: true or secret_patterns")
    return rule


def result_guard_rules(file: str, node: Any, where: str) -> tuple[ResultGuardRule, ...]:
    """The entries of a ``result_guards`` list node, in order."""
    if node is None:
        raise ConfigError(file, line_of(node), f"{where} has no value (null); give it a list or remove it")
    if not isinstance(node, CommentedSeq):
        raise ConfigError(file, line_of(node), f"{where} must be a list of entries")
    if not node:
        raise ConfigError(file, line_of(node), f"{where} is empty: give at least one entry, or remove it")
    return tuple(_entry(file, item, where, index) for index, item in enumerate(node))


def result_guards_section(top: Reader) -> tuple[ResultGuardRule, ...] | None:
    """serve's ``result_guards``; None when absent (results pass as they come)."""
    if "result_guards" not in top.node:
        return None
    node = top.node["result_guards"]
    if node is None:
        raise top.null("result_guards")
    if not isinstance(node, CommentedSeq):
        raise top.fail("result_guards", "result_guards must be a list of entries")
    return result_guard_rules(top.file, node, "result_guards")


def load_result_guards(path: str) -> tuple[ResultGuardRule, ...]:
    """``wrap --result-guards FILE``: a YAML file holding the list itself (or a mapping with the one key
    ``result_guards``, as in serve's file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, None, f"cannot read the result guards: {exc.__class__.__name__}: {exc}") from None
    try:
        root = read_yaml(text)
    except YamlProblem as exc:
        raise ConfigError(path, exc.line, exc.problem) from None
    if isinstance(root, CommentedMap):
        top = Reader(path, root, "config")
        top.check_keys({"result_guards"})
        found = result_guards_section(top)
        if found is None:
            raise ConfigError(path, None, "the file names no result_guards")
        return found
    return result_guard_rules(path, root, "result_guards")


__all__ = [
    "MAX_MAX_BYTES", "MIN_MAX_BYTES", "ResultGuardRule", "load_result_guards", "result_guard_rules",
    "result_guards_section",
]
