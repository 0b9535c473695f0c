"""Numbers in YAML text that every reader takes the same way: the one rule of the Assay reader
(``evidence.truth.assay_yaml``) and the strict reader of policies, tables and the configuration
(``policy.strict_yaml``).

Invariant: a scalar that a YAML reader resolves (or that is tagged) as an integer or a float becomes a
number only when it is spelled the way YAML readers agree on: a decimal integer without a leading zero
(``0``, ``-12``, ``+7``), ``0x`` hexadecimal, ``0o`` octal, and a float of digits, an optional point
and an optional exponent (``1.5``, ``.5``, ``1e3``). Anything else is refused, never read: ``1_000``
(a number to YAML 1.1 and ruamel, a string to Go's yaml.v3 and serde), ``012`` (8 to YAML 1.1, 12 to
YAML 1.2), ``0b11``, ``0x_1``, ``1:20`` (80 to YAML 1.1), and the non-finite ``.inf``/``.nan`` (not
JSON). The text of the scalar is never part of a message: a value may be a secret.
"""

from __future__ import annotations

import math
import re

INT_DEC = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
INT_HEX = re.compile(r"0x[0-9a-fA-F]+")
INT_OCT = re.compile(r"0o[0-7]+")
FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")

AMBIGUOUS_INTEGER = "ambiguous integer spelling; write it plainly or quote it"
NOT_FINITE = "number is not a finite JSON number"


class NumberSpelling(ValueError):
    """A number spelled so that readers differ, or not finite: ``integer`` says which rule it broke."""

    def __init__(self, problem: str, *, integer: bool) -> None:
        self.problem = problem
        self.integer = integer
        super().__init__(problem)


def integer_value(text: str) -> int:
    """The integer an ``int`` scalar spells, or ``NumberSpelling``."""
    if INT_DEC.fullmatch(text):
        return int(text)
    if INT_HEX.fullmatch(text):
        return int(text[2:], 16)
    if INT_OCT.fullmatch(text):
        return int(text[2:], 8)
    raise NumberSpelling(AMBIGUOUS_INTEGER, integer=True)


def float_value(text: str) -> float:
    """The finite float a ``float`` scalar spells, or ``NumberSpelling``."""
    if FLOAT.fullmatch(text):
        number = float(text)
        if math.isfinite(number):
            return number
    raise NumberSpelling(NOT_FINITE, integer=False)


__all__ = ["AMBIGUOUS_INTEGER", "NOT_FINITE", "NumberSpelling", "float_value", "integer_value"]
