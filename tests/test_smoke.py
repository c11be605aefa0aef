from datetime import timedelta

from rota import Queue


async def test_enqueue_claim_complete(queue: Queue) -> None:
    job = await queue.enqueue("enrich", {"channel": "c1"})
    assert job is not None and job.status == "pending" and job.attempts == 0
    claimed = await queue.claim("enrich", 5)
    assert [j.id for j in claimed] == [job.id]
    assert claimed[0].attempts == 1 and claimed[0].status == "running"
    assert await queue.complete(claimed[0]) is True
    # Asked again under the same claim: "already done by this claim" (docs/design.md,
    # "Settling twice").
    assert await queue.complete(claimed[0]) is True
    queue.clock_offset = timedelta(minutes=3)
    assert (await queue.get_job(job.id)).status == "done"  # type: ignore[union-attr]
