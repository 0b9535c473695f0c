"""The catalogue core: classify tools, pin their fingerprints, compute floors, draft a policy.

Pure: plain functions and frozen dataclasses, no I/O. ``classify`` says what a tool declares
about itself (family, access, reasons; advice, never a decision); ``fingerprint`` pins a
server's catalogue and compares it with what the server lists now; ``floors`` turns pin
statuses and CLI dispatchers into actions the policy cannot relax; ``draft`` writes a strict
starting policy from a classified catalogue.
"""

from drawbridge.catalogue.classify import (
    DISPATCHER_WORD,
    EXECUTOR_WORDS,
    GENERIC_ARGUMENTS,
    READ_METHODS,
    READ_VERBS,
    SIGNALS,
    WRITE_VERBS,
    Access,
    Classification,
    Effect,
    Family,
    Reason,
    ReasonCode,
    Signal,
    classify_tool,
    is_dispatcher_name,
    name_words,
)
from drawbridge.catalogue.draft import DraftTool, draft_action, escape_glob, generate_draft, origin_label
from drawbridge.catalogue.fingerprint import (
    PINNED_FIELDS,
    PinComparison,
    PinStatus,
    ToolPin,
    accept,
    compare,
    pinned_document,
    tool_fingerprint,
)
from drawbridge.catalogue.floors import (
    DISPATCHER_FLOOR,
    NO_FLOOR,
    PIN_FLOORS,
    Floor,
    Floored,
    apply_floor,
    dispatcher_floor,
    pin_floor,
    stricter,
    tool_floor,
)

__all__ = [
    "tool_fingerprint",
    "DISPATCHER_FLOOR",
    "DISPATCHER_WORD",
    "EXECUTOR_WORDS",
    "GENERIC_ARGUMENTS",
    "NO_FLOOR",
    "PINNED_FIELDS",
    "PIN_FLOORS",
    "READ_METHODS",
    "READ_VERBS",
    "SIGNALS",
    "WRITE_VERBS",
    "Access",
    "Classification",
    "DraftTool",
    "Effect",
    "Family",
    "Floor",
    "Floored",
    "PinComparison",
    "PinStatus",
    "Reason",
    "ReasonCode",
    "Signal",
    "ToolPin",
    "accept",
    "apply_floor",
    "classify_tool",
    "compare",
    "dispatcher_floor",
    "draft_action",
    "escape_glob",
    "generate_draft",
    "is_dispatcher_name",
    "name_words",
    "origin_label",
    "pin_floor",
    "pinned_document",
    "stricter",
    "tool_floor",
]
