"""The one error type of the package, and the integer check every constructor shares."""

from __future__ import annotations

import operator
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
