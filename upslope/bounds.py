"""Bounded option types for plugin signatures. `Registry.bind` validates an option against its annotation,
so a value out of range is one error line naming the option before training starts; the plugin tables
(`upslope plugins`, docs/plugins.md) show the bounds."""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

NonNegative = Annotated[float, Field(ge=0)]  # a weight, coefficient, epsilon or slack
Positive = Annotated[float, Field(gt=0)]  # a scale, time limit or prior
Fraction = Annotated[float, Field(ge=0, le=1)]  # a probability, share, mixing weight or discount
PositiveFraction = Annotated[float, Field(gt=0, le=1)]  # a share or probability shift that must not vanish
ClipLow = Annotated[float, Field(ge=0, lt=1)]  # a lower clip distance: the bound 1 - eps stays above 0
Count = Annotated[int, Field(ge=0)]  # steps, items or tokens where 0 means none (or off)
PositiveCount = Annotated[int, Field(ge=1)]  # sizes, limits and lengths of at least one


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a regular expression ({exc})") from None
    return pattern


Regex = Annotated[str, AfterValidator(_compiles)]  # a pattern: compiled when the option is bound, not at the first reply
