"""Runtime evidence the verdict gate needs beyond the tool name, arguments and identity (2.7).

Invariant: every field is optional, and an absent field means "not observed",
never "satisfied". A declared constraint whose evidence is absent resolves to
``incomplete`` in the verdict gate, so missing evidence can only make a verdict
more conservative, never a ``match``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Evidence"]

_FLAGS = ("approval_obtained", "scope_satisfied", "redaction_applied")


@dataclass(frozen=True)
class Evidence:
    """What was observed about one decision's classes, approval, scope and redaction.

    ``tool_classes`` is the set of classes the tool was observed to belong to
    (``None``: not observed; ``()``: observed to have none). A list given to the
    constructor is stored as a tuple. Wrong types raise ``TypeError``.
    """

    tool_classes: tuple[str, ...] | None = None
    approval_obtained: bool | None = None
    scope_satisfied: bool | None = None
    redaction_applied: bool | None = None

    def __post_init__(self) -> None:
        if self.tool_classes is not None:
            if isinstance(self.tool_classes, (str, bytes)) or not isinstance(self.tool_classes, Iterable):
                raise TypeError("tool_classes must be a sequence of strings or None")
            classes = tuple(self.tool_classes)
            if not all(isinstance(c, str) for c in classes):
                raise TypeError("tool_classes must contain strings only")
            object.__setattr__(self, "tool_classes", classes)
        for name in _FLAGS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be a boolean or None")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> Evidence:
        """Evidence from its JSON object form (the vectors' ``evidence``); ``None`` is no evidence.

        Stricter than the reference's reader, which silently drops non-string
        classes and non-boolean flags: dropping a class could turn an applicable
        obligation into a non-applicable one, so a wrong type is a ``ValueError``.
        ``null`` or a missing key means "not observed"; unknown keys are ignored
        (a misspelt key reads as "not observed", which is only ever more conservative).
        """
        if obj is None:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValueError("evidence must be a JSON object or null")
        classes = obj.get("tool_classes")
        if classes is not None and (
            not isinstance(classes, (list, tuple)) or not all(isinstance(c, str) for c in classes)
        ):
            raise ValueError("evidence.tool_classes must be an array of strings or null")
        flags: dict[str, bool | None] = {}
        for name in _FLAGS:
            value = obj.get(name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"evidence.{name} must be a boolean or null")
            flags[name] = value
        return cls(tool_classes=None if classes is None else tuple(classes), **flags)

    def to_json(self) -> dict[str, Any]:
        """The JSON object form, with ``null`` for what was not observed."""
        return {
            "tool_classes": None if self.tool_classes is None else list(self.tool_classes),
            "approval_obtained": self.approval_obtained,
            "scope_satisfied": self.scope_satisfied,
            "redaction_applied": self.redaction_applied,
        }
