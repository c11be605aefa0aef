"""The claim size the runner chooses for a stage whose ``batch`` is None
(docs/design.md, "Batch size")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rota import InvalidInput, JobContext, Pipeline, Queue, Stage
from rota.runner.batching import BatchSize


@pytest.mark.parametrize(("size", "claimed", "handled_s", "after"), [
    (25, 25, 0.01, 50),       # full and fast: doubles
    (800, 800, 0.01, 1000),   # up to MAX
    (1000, 1000, 0.0, 1000),  # and no further
    (25, 24, 0.01, 25),       # short claim: the backlog is what it is
    (25, 25, 0.5, 25),        # full but neither fast nor slow: stays
    (25, 25, 1.5, 12),        # slow: halves
    (1, 1, 30.0, 1),          # down to 1
    (40, 3, 2.0, 20),         # slow halves even when short
])
def test_batch_size_rules(size: int, claimed: int, handled_s: float, after: int) -> None:
    b = BatchSize(size)
    b.observe(claimed, handled_s)
    assert b.size == after


def test_a_stage_without_batch_starts_at_25() -> None:
    async def h(ctx: JobContext) -> None: ...
    assert Stage("t", handler=h).batch is None
    assert BatchSize().size == 25
    with pytest.raises(InvalidInput, match="stage 't': batch"):
        Stage("t", 0, handler=h)


async def claimed_sizes(queue: Queue, pipeline: Pipeline) -> list[tuple[int, int]]:
    """Run the pipeline once; (asked, got) of every claim it made."""
    sizes: list[tuple[int, int]] = []
    claim = queue.claim_checked

    async def recording(type: str, limit: int, **kw: Any) -> Any:
        jobs, unreadable = await claim(type, limit, **kw)
        sizes.append((limit, len(jobs)))
        return jobs, unreadable

    queue.claim_checked = recording  # type: ignore[method-assign]
    try:
        result = await pipeline.run(trigger="manual")
    finally:
        del queue.claim_checked
    assert result.stop_reason == "no_work"
    return sizes


async def test_fast_handlers_on_a_backlog_double_the_claim(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BatchSize, "FAST", 60.0)  # every batch counts as fast here
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(400)])
    done = 0

    async def h(ctx: JobContext) -> None:
        nonlocal done
        done += 1

    pipeline = Pipeline(queue, [Stage("t", handler=h)])
    sizes = await claimed_sizes(queue, pipeline)
    # 25 + 50 + 100 + 200 = 375 jobs, then 25 of the 400 asked, then nothing.
    assert sizes == [(25, 25), (50, 50), (100, 100), (200, 200), (400, 25), (400, 0)]
    assert done == 400
    # The size is kept for the pipeline's next run.
    assert pipeline.batch_size(pipeline.stages[0]) == 400


async def test_slow_handlers_halve_the_claim(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BatchSize, "SLOW", 0.001)  # every batch counts as slow here
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(45)])

    async def h(ctx: JobContext) -> None:
        await asyncio.sleep(0.002)

    pipeline = Pipeline(queue, [Stage("t", handler=h)])
    sizes = await claimed_sizes(queue, pipeline)
    # 25, 12, 6 = 43; then 3 asked, 2 left; then 1 asked, none left.
    assert sizes == [(25, 25), (12, 12), (6, 6), (3, 2), (1, 0)]


async def test_a_fixed_batch_is_never_resized(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BatchSize, "FAST", 60.0)
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(30)])

    async def h(ctx: JobContext) -> None: ...

    sizes = await claimed_sizes(queue, Pipeline(queue, [Stage("t", 10, handler=h)]))
    assert sizes == [(10, 10), (10, 10), (10, 10), (10, 0)]
