"""A command-line option that holds a duration in seconds.

Invariant: such an option holds a finite number within its range. ``click.FloatRange`` alone lets
``nan`` through (every comparison with it is false) and ``inf`` through when it has no upper bound;
either would become a timeout that fires at once or never, or a traceback further on. Both are a
usage error (exit 2), named as such.
"""

from __future__ import annotations

import math
from typing import Any

import click


class Seconds(click.FloatRange):
    """A ``FloatRange`` that also refuses ``nan`` and the infinities."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)  # finite first: inf is no number out of range
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return super().convert(number, param, ctx)


__all__ = ["Seconds"]
