"""Human approval, the pure part: channels and their strength, argument shapes, the injection
heuristic, approval memory, durations, what a person is shown of the arguments.

Nothing here does I/O, reads a clock or draws randomness. The stores that persist approvals,
grants and pins live in ``drawbridge.state`` and import from here, never the other way round.
"""

from drawbridge.approval.channels import HUMAN_CHANNELS, STRENGTH, Channel, Strength, strength_of
from drawbridge.approval.durations import DurationError, format_duration, parse_duration
from drawbridge.approval.memory import (
    DEFAULT_MIN_APPROVALS,
    MEMORY_RESOLVER,
    MemoryConfig,
    MemoryCounts,
    MemoryDecision,
    decide,
    tally,
)
from drawbridge.approval.shape import (
    INJECTION_PATTERNS,
    ArgumentShape,
    ShapeError,
    argument_shape,
    injection_findings,
    looks_like_injection,
    shape_of,
)
from drawbridge.approval.shown_arguments import ShownArguments, ShownValue, argument_lines, show_arguments

__all__ = [
    "DEFAULT_MIN_APPROVALS",
    "HUMAN_CHANNELS",
    "INJECTION_PATTERNS",
    "MEMORY_RESOLVER",
    "STRENGTH",
    "ArgumentShape",
    "Channel",
    "DurationError",
    "MemoryConfig",
    "MemoryCounts",
    "MemoryDecision",
    "ShapeError",
    "ShownArguments",
    "ShownValue",
    "Strength",
    "argument_lines",
    "argument_shape",
    "decide",
    "format_duration",
    "injection_findings",
    "looks_like_injection",
    "parse_duration",
    "shape_of",
    "show_arguments",
    "strength_of",
    "tally",
]
