"""The one error type of the package, and the integer check every constructor shares."""

from __future__ import annotations

import difflib
import operator
from collections.abc import Iterable
from typing import Any

import numpy as np


class TopologyError(ValueError):
    """Every invalid topology, option or matrix: one type to catch and a one-line message to show."""


def _integer(value: Any, what: str) -> int:
    """Accept any int-like (numpy ints from configs included) but not bools or floats, which hide typos."""
    if isinstance(value, (bool, np.bool_)):
        raise TopologyError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TopologyError(f"{what} must be an integer, got {value!r}") from None


def did_you_mean(word: Any, valid: Iterable[str]) -> str:
    """``"; did you mean 'ring'?"`` for a near miss of one of ``valid`` (a typo), else ``""``."""
    close = difflib.get_close_matches(str(word), list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
