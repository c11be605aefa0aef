"""Plans: ordered tiers whose priority ranks the claim, and the limits an application
reads from the owner's plan (docs/design.md, "Vocabulary"). Display labels, such as a
pricing table's "search queue" row, belong to the application: it derives them from this
object's priority order (see ``rota_demo.pricing``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .checks import INT_MAX, shown
from .errors import InvalidInput, UnknownPlan

#: The largest plan weight: the claim divides served counts by it (a numeric ratio), and a
#: share of one in a million is already none.
MAX_WEIGHT = 1_000_000
#: The largest cap of running jobs an owner of a plan may have (``Plan.max_running``):
#: what the claim's caps hold (a PostgreSQL ``integer``), the same as a group's own cap
#: (``groups.max_running``, :data:`rota.admin.MAX_GROUP_RUNNING`).
MAX_RUNNING = INT_MAX
#: The largest priority either way (``Plan.priority``): the claim reads priorities as
#: PostgreSQL ``integer`` and negates them to sort (``-priority``), so -2**31, whose
#: negation an ``integer`` cannot hold, is left out.
MAX_PRIORITY = INT_MAX


@dataclass(frozen=True)
class Plan:
    """One plan.

    Args:
        id: stable identifier stored in the groups relation (``"free"``, ``"pro"``).
        name: display name (``"Free"``), a string.
        priority: claim priority, an int from ``-MAX_PRIORITY`` to :data:`MAX_PRIORITY`
            (2,147,483,647); higher is claimed first when there is a backlog.
        limits: free-form limits (``{"searches_per_day": 20, "draft_credits": 50}``).
        weight: how plans of the same priority share the claim (docs/design.md, "The
            fair claim"): a positive int, at most :data:`MAX_WEIGHT`, default 1. The
            units compared (groups, or owners under ``fair_by="owner"``) are claimed in
            proportion to their plan's weight: their served count is divided by it
            (virtual time). Plans of different priorities stay strict.
        max_running: at most this many jobs of each owner of this plan (a group
            without an owner is its own) running at once, across every worker and host
            and every type (docs/design.md, "Caps"): an int from 1 to
            :data:`MAX_RUNNING` (2,147,483,647, as a group's own cap); ``None`` (the
            default) for no cap.
            Work-conserving: while an owner is at its cap the claim hands the capacity
            to others, in fair order. A job whose lock went stale holds no slot.

    Raises:
        InvalidInput: an empty or NUL-holding id, a name that is not a string, a
            priority that is not an int in -MAX_PRIORITY..MAX_PRIORITY, limits that are
            not a mapping, a weight that is not an int in 1..MAX_WEIGHT, a max_running
            that is not an int in 1..MAX_RUNNING (or None). The message names the plan
            and the argument and ends with what was given (``got '1'``).
    """

    id: str
    name: str
    priority: int
    limits: Mapping[str, Any] = field(default_factory=dict)
    weight: int = 1
    max_running: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise InvalidInput(f"plan id must be a non-empty string, got {self.id!r}")
        if "\x00" in self.id:
            raise InvalidInput(f"plan id {self.id!r} contains a NUL character")
        if not isinstance(self.name, str):
            raise InvalidInput(f"plan {self.id!r}: name must be a string, got "
                               f"{shown(self.name)}")
        self._check_int("priority", self.priority, -MAX_PRIORITY, MAX_PRIORITY)
        if self.limits is not None and not isinstance(self.limits, Mapping):
            # Plan(id, name, priority, "First") was a display label: now the application's.
            raise InvalidInput(f"plan {self.id!r}: limits must be a mapping, got "
                               f"{shown(self.limits)} (display labels are not "
                               f"part of a Plan)")
        object.__setattr__(self, "limits", MappingProxyType(dict(self.limits or {})))
        self._check_int("weight", self.weight, 1, MAX_WEIGHT)
        if self.max_running is not None:
            self._check_int("max_running", self.max_running, 1, MAX_RUNNING,
                            " (or None for no cap)")

    def _check_int(self, name: str, value: object, low: int, high: int,
                   alternative: str = "") -> None:
        """Refuse ``value`` unless it is an int (not a bool) from ``low`` to ``high``:
        ``plan 'pro': weight must be an int from 1 to 1,000,000, got '2'``."""
        if (not isinstance(value, int) or isinstance(value, bool)
                or not low <= value <= high):
            raise InvalidInput(f"plan {self.id!r}: {name} must be an int from {low:,} to "
                               f"{high:,}{alternative}, got {shown(value)}")


class Plans:
    """An ordered collection of plans, lowest to highest.

    The middle plan (index ``(n - 1) // 2``) ranks jobs that have no group and groups
    that have no owner, so housekeeping neither always wins nor always loses. A plan id
    stored in the groups relation that is not here ranks as the lowest plan.

    Plans may share a priority: they are then claimed in proportion to their weights
    (:class:`Plan`); ordered lowest to highest means priorities never decrease.

    Args:
        plans: the plans (:class:`Plan`), lowest to highest.

    Raises:
        InvalidInput: not an iterable of :class:`Plan`, no plans, duplicate ids, or a
            priority lower than the one before; the message ends with what was given.
    """

    def __init__(self, plans: Iterable[Plan]) -> None:
        if isinstance(plans, Plan | str | bytes) or not isinstance(plans, Iterable):
            raise InvalidInput(f"Plans needs a list of rota.Plan, got "
                               f"{shown(plans)}")
        self._plans = tuple(plans)
        if not self._plans:
            raise InvalidInput(f"Plans needs at least one plan, got {shown(plans)}")
        for plan in self._plans:
            if not isinstance(plan, Plan):
                raise InvalidInput(f"Plans needs a list of rota.Plan, got "
                                   f"{shown(plan)} among them")
        ids = [p.id for p in self._plans]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise InvalidInput(f"duplicate plan ids {twice} in {ids}")
        prios = [p.priority for p in self._plans]
        if any(b < a for a, b in itertools.pairwise(prios)):
            raise InvalidInput(
                f"plans must be ordered lowest to highest (priorities never decreasing), "
                f"got {prios}"
            )
        self._by_id = {p.id: p for p in self._plans}

    def __iter__(self) -> Iterator[Plan]:
        return iter(self._plans)

    def __len__(self) -> int:
        return len(self._plans)

    def __getitem__(self, plan_id: str) -> Plan:
        try:
            return self._by_id[plan_id]
        except KeyError:
            raise UnknownPlan(
                f"unknown plan {plan_id!r}; known plans: {', '.join(self._by_id)}"
            ) from None

    def __contains__(self, plan_id: object) -> bool:
        return plan_id in self._by_id

    @property
    def lowest(self) -> Plan:
        return self._plans[0]

    @property
    def middle(self) -> Plan:
        return self._plans[(len(self._plans) - 1) // 2]

    @property
    def highest(self) -> Plan:
        return self._plans[-1]

    @property
    def capped(self) -> bool:
        """Whether any plan caps its owners' running jobs (``Plan.max_running``)."""
        return any(p.max_running is not None for p in self._plans)

    def claim_params(self) -> dict[str, Any]:
        """The bound parameters the claim ranks by: plan ids, priorities, weights and
        caps (``None``: none) as arrays, and the middle and lowest plans' priorities and
        weights."""
        return {
            "plan_ids": [p.id for p in self._plans],
            "plan_priorities": [p.priority for p in self._plans],
            "plan_weights": [p.weight for p in self._plans],
            "plan_caps": [p.max_running for p in self._plans],
            "middle_priority": self.middle.priority,
            "lowest_priority": self.lowest.priority,
            "middle_weight": self.middle.weight,
            "lowest_weight": self.lowest.weight,
        }


DEFAULT_PLANS = Plans(
    [
        Plan("free", "Free", 0),
        Plan("standard", "Standard", 1),
        Plan("pro", "Pro", 2),
    ]
)
