"""The claim size of a stage whose ``batch`` is left to the runner (docs/design.md,
"Batch size").

A claim costs about the same whether it takes 1 job or 25 (it ranks groups, not the
backlog), so with fast handlers and a backlog, jobs per claim decide jobs per second;
with slow handlers a large batch holds jobs that another worker could run, and runs past
the time budget. :class:`BatchSize` starts at ``START`` and, after each batch:

- doubles, up to ``MAX``, when the claim came back full (a backlog) and the batch's
  handlers all finished within ``FAST`` seconds;
- halves, down to 1, when they took longer than ``SLOW`` seconds;
- stays put otherwise (a short claim: the backlog is what it is).

So a claim never holds more than about a second of work, and no-op or millisecond
handlers on a deep backlog are claimed hundreds at a time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BatchSize:
    """The current claim size of one stage in one pipeline (kept across its runs).

    Attributes:
        size: jobs the next claim asks for, in ``1..MAX``.
    """

    START = 25
    MAX = 1000
    FAST = 0.1   # seconds: a full batch handled this fast doubles the next claim
    SLOW = 1.0   # seconds: a batch handled this slowly halves it

    size: int = START

    def observe(self, claimed: int, handled_s: float) -> None:
        """Adjust after one batch.

        Args:
            claimed: jobs the claim returned (``size`` when the backlog filled it).
            handled_s: seconds from the batch's start to its last handler's end.
        """
        if handled_s > self.SLOW:
            self.size = max(1, self.size // 2)
        elif claimed >= self.size and handled_s < self.FAST:
            self.size = min(self.MAX, self.size * 2)
