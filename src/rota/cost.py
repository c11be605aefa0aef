"""A job's cost: what it counts in its group's and owner's served counts
(docs/design.md, "Cost").

A handler charges units with ``ctx.charge(units)`` (summed over its calls), or its stage
declares ``Stage(..., cost="seconds")`` and the runner charges the handler's measured
run time in seconds. A job that charged nothing costs 1, so an application that never
charges is ordered exactly as before. Costs are exact decimals with :data:`PLACES`
places (stored as PostgreSQL ``numeric``), so every served count is an exact sum.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from .errors import InvalidCharge, InvalidInput

#: The most one job can be charged, in units (what ``jobs.cost`` accepts).
MAX_COST = 1_000_000_000
#: Decimal places a cost keeps; a smaller positive total counts as the smallest step.
PLACES = 6
_STEP = Decimal(1).scaleb(-PLACES)
#: The stage cost modes: ``"units"`` (what the handler charges, 1 when nothing) and
#: ``"seconds"`` (the handler's measured run time, plus what it charges).
COST_MODES = ("units", "seconds")


def charge_units(units: Any) -> Decimal:
    """One charge, checked: ``units`` as an exact decimal.

    Args:
        units: a positive finite ``int``, ``float`` or ``Decimal`` (not a bool), at most
            :data:`MAX_COST`.

    Returns:
        The charge as a ``Decimal`` (a float's exact binary value; rounded once, when the
        job's total is taken, :func:`job_cost`).

    Raises:
        InvalidCharge: ``units`` is not such a number; the message says what it was.
    """
    if isinstance(units, bool) or not isinstance(units, (int, float, Decimal)):
        raise InvalidCharge(f"a charge must be a positive number of units, got "
                            f"{type(units).__name__} {units!r:.40}")
    if (isinstance(units, float) and not math.isfinite(units)) or (
            isinstance(units, Decimal) and not units.is_finite()):
        raise InvalidCharge(f"a charge must be a finite number of units, got {units}")
    value = Decimal(units)
    if value <= 0:
        raise InvalidCharge(f"a charge must be more than 0 units, got {units}")
    if value > MAX_COST:
        raise InvalidCharge(f"a charge of {units} units is more than one job may cost "
                            f"({MAX_COST:,})")
    return value


def job_cost(total: Decimal | float | int) -> Decimal:
    """A job's cost from the sum of its charges: rounded to :data:`PLACES` places, at
    least one step (0.000001) and at most :data:`MAX_COST`.

    Raises:
        InvalidCharge: the total is more than :data:`MAX_COST` units (its charges, each
            within the limit, added up past it).
    """
    value = Decimal(total)
    if not value.is_finite() or value > MAX_COST:
        raise InvalidCharge(f"the charges of one job add up to {total} units, more than "
                            f"one job may cost ({MAX_COST:,})")
    return max(value.quantize(_STEP), _STEP)


def check_mode(cost: Any) -> str:
    """A stage's ``cost=`` setting, checked.

    Raises:
        InvalidInput: not one of :data:`COST_MODES`.
    """
    if not isinstance(cost, str) or cost not in COST_MODES:
        raise InvalidInput(f"cost must be one of {', '.join(map(repr, COST_MODES))}, "
                            f"got {cost!r:.40}")
    return cost


def counted_cost(status: str, cost: Decimal) -> Decimal | None:
    """What a job counts now in its group's and owner's served counts (docs/design.md,
    "Cost"), from its ``status`` and ``jobs.cost``: while ``running``, the expected cost
    it was claimed with; once ``done``, what it was charged (1 when nothing); ``None``
    while ``pending`` or once ``failed``, when it counts nothing (a failed attempt is not
    charged, whatever cost its last claim left in the row)."""
    return cost if status in ("running", "done") else None


def format_units(value: Decimal | float | int | None) -> str:
    """A cost in units for a page or a table: thousands separated, at most 2 decimal
    places, none for a whole number (``1,234``, ``0.5``, ``12.25``); ``—`` for
    ``None``."""
    if value is None:
        return "—"
    text = f"{float(value):,.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text
