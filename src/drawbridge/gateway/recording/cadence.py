"""How often a signed checkpoint is written by default, in a module of their own: the command lines
show these defaults before the gateway imports its recorder (and the signing library)."""

from __future__ import annotations

from typing import Final

EVERY_LINES: Final = 1000
EVERY_SECONDS: Final = 10.0

__all__ = ["EVERY_LINES", "EVERY_SECONDS"]
