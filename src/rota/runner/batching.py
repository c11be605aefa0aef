"""The claim size of a stage whose ``batch`` is left to the runner (docs/design.md,
"Batch size").

A claim costs about the same whether it takes 1 job or 25 (it ranks groups, not the
backlog), so with fast handlers and a backlog, jobs per claim decide jobs per second;
with slow handlers a large batch holds jobs that another worker could run, and runs past
the time budget. :class:`BatchSize` starts at the stage's concurrency (one job at a
time by default: a first claim never holds more than one round of handlers) and, after
each batch:

- grows, up to ``MAX``, when the claim came back full (a backlog) and the batch's
  handlers all finished within ``FAST`` seconds: to what they would handle in ``FAST``
  seconds at the batch's pace, at least double and at most ``GROW`` times the size;
- halves, down to the stage's concurrency, when they took longer than ``SLOW`` seconds;
- stays put otherwise (a short claim: the backlog is what it is).

A batch whose free slots were refilled while it ran (docs/design.md, "Refill") ran more
than one claim: it is judged by the time one claim of the current size took at its
pace (its seconds times ``size`` over the jobs it ran), so a long run of refills at a
fast pace grows the size as a fast batch does, and does not halve it for lasting long.

So the next claim is sized to take at most about ``2 * FAST`` seconds at the pace just
measured (as when it only doubled), a claim holds about a second of work beyond one
round of handlers at most, and no-op or millisecond handlers on a deep backlog are
claimed hundreds at a time within four claims (no-op handlers from 1: 8, 64, 512, then
1,000). Doubling alone took ten claims to reach 1,000: about 40 % of a 5,000-job
drain's time went to them (bench/drain.py, default settings).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BatchSize:
    """The current claim size of one stage in one pipeline (kept across its runs).

    Attributes:
        floor: the stage's concurrency (at most ``MAX``): where the size starts and
            the least it goes down to.
        size: jobs the next claim asks for, in ``floor..MAX``.
    """

    MAX = 1000
    FAST = 0.1   # seconds: a full batch handled within this grows the next claim
    SLOW = 1.0   # seconds: a batch handled this slowly halves it
    GROW = 8     # the most one fast batch multiplies the size by

    floor: int = 1
    size: int = 0

    def __post_init__(self) -> None:
        self.floor = max(1, min(self.MAX, self.floor))
        self.size = min(self.MAX, max(self.floor, self.size))

    def observe(self, claimed: int, handled_s: float) -> None:
        """Adjust after one batch.

        Args:
            claimed: jobs the batch ran: its claim (``size`` when the backlog filled
                it) plus what its refills claimed (docs/design.md, "Refill").
            handled_s: seconds from the batch's start to its last handler's end.
        """
        # A refilled batch ran more than one claim: what is judged is the time one
        # claim of `size` took at its pace (a batch of one claim: its own time).
        if claimed > self.size:
            handled_s *= self.size / claimed
        if handled_s > self.SLOW:
            self.size = max(self.floor, self.size // 2)
        elif claimed >= self.size and handled_s < self.FAST:
            # The size FAST seconds would handle at this batch's pace, at least double;
            # at most GROW times, as a batch of a few jobs says little about the next.
            factor = self.FAST / handled_s if handled_s > 0 else self.GROW
            self.size = min(self.MAX, int(self.size * min(max(factor, 2), self.GROW)))
