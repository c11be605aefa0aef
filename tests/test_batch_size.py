"""The claim size the runner chooses for a stage whose ``batch`` is None
(docs/design.md, "Batch size")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rota import InvalidInput, JobContext, Pipeline, Queue, Stage
from rota.runner.batching import BatchSize


@pytest.mark.parametrize(("floor", "size", "claimed", "handled_s", "after"), [
    (1, 25, 25, 0.05, 50),       # full and fast: 0.1 s at this pace is double
    (1, 25, 25, 0.09, 50),       # at least double
    (1, 25, 25, 0.02, 125),      # 0.1 s at this pace: 5 times
    (1, 25, 25, 0.01, 200),      # at most 8 times
    (1, 1, 1, 0.0, 8),           # a batch timed at nothing: 8 times
    (4, 4, 4, 0.04, 10),         # from the stage's concurrency, rounded down
    (1, 800, 800, 0.01, 1000),   # up to MAX
    (1, 1000, 1000, 0.0, 1000),  # and no further
    (1, 25, 24, 0.01, 25),       # short claim: the backlog is what it is
    (1, 25, 25, 0.5, 25),        # full but neither fast nor slow: stays
    (1, 25, 25, 1.5, 12),        # slow: halves
    (1, 1, 1, 30.0, 1),          # down to 1
    (1, 40, 3, 2.0, 20),         # slow halves even when short
    (8, 12, 12, 1.5, 8),         # never below the stage's concurrency
    (8, 8, 8, 30.0, 8),
    # A refilled batch ran more than its claim: judged by one claim's time at its pace
    # (docs/design.md, "Refill").
    (4, 4, 40, 0.5, 8),          # 0.05 s a claim of 4: grows, where 0.5 s would stay
    (4, 4, 160, 2.0, 8),         # 0.05 s a claim: grows, where 2 s would halve
    (4, 8, 16, 1.5, 8),          # 0.75 s a claim: stays
    (16, 32, 64, 3.0, 16),       # 1.5 s a claim: halves
])
def test_batch_size_rules(floor: int, size: int, claimed: int, handled_s: float,
                          after: int) -> None:
    b = BatchSize(floor, size)
    b.observe(claimed, handled_s)
    assert b.size == after


def test_a_stage_without_batch_starts_at_its_concurrency() -> None:
    async def h(ctx: JobContext) -> None: ...
    assert Stage("t", handler=h).batch is None
    assert BatchSize().size == 1
    assert BatchSize(5).size == 5
    assert BatchSize(5000).size == 1000  # a concurrency past MAX claims MAX
    with pytest.raises(InvalidInput, match="stage 't': batch"):
        Stage("t", 0, handler=h)


async def claimed_sizes(queue: Queue, pipeline: Pipeline) -> list[tuple[int, int]]:
    """Run the pipeline once; (asked, got) of every claim it made (through its own
    queue, ``pipeline.queue``, which shares ``queue``'s pool and settings)."""
    queue = pipeline.queue
    sizes: list[tuple[int, int]] = []
    claim = queue.claim

    async def recording(type: str, limit: int, **kw: Any) -> Any:
        jobs = await claim(type, limit, **kw)
        sizes.append((limit, len(jobs)))
        return jobs

    queue.claim = recording  # type: ignore[method-assign]
    try:
        result = await pipeline.run(trigger="manual")
    finally:
        del queue.claim
    assert result.stop_reason == "no_work"
    return sizes


async def test_fast_handlers_on_a_backlog_grow_the_claim(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every batch counts as fast, and 60 s at its pace is more than 8 times its size.
    monkeypatch.setattr(BatchSize, "FAST", 60.0)
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(400)])
    done = 0

    async def h(ctx: JobContext) -> None:
        nonlocal done
        done += 1

    pipeline = Pipeline(queue, [Stage("t", handler=h)])
    sizes = await claimed_sizes(queue, pipeline)
    # 1 + 8 + 64 = 73 jobs, then the 327 left of the 512 asked (short: it stays), then
    # nothing.
    assert sizes == [(1, 1), (8, 8), (64, 64), (512, 327), (512, 0)]
    assert done == 400
    # The size is kept for the pipeline's next run.
    assert pipeline.batch_size(pipeline.stages[0]) == 512


async def test_slow_handlers_halve_the_claim(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BatchSize, "SLOW", 0.001)  # every batch counts as slow here
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(45)])

    async def h(ctx: JobContext) -> None:
        await asyncio.sleep(0.002)

    pipeline = Pipeline(queue, [Stage("t", handler=h, concurrency=4)])
    pipeline._sizes["t"] = BatchSize(4, 32)  # as after a fast spell
    sizes = await claimed_sizes(queue, pipeline)
    # 32, then 13 of 16 asked (slow: halved), then 8 asked (halved), none left.
    assert sizes == [(32, 32), (16, 13), (8, 0)]


async def test_a_fixed_batch_is_never_resized(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BatchSize, "FAST", 60.0)
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(30)])

    async def h(ctx: JobContext) -> None: ...

    sizes = await claimed_sizes(queue, Pipeline(queue, [Stage("t", 10, handler=h)]))
    assert sizes == [(10, 10), (10, 10), (10, 10), (10, 0)]
