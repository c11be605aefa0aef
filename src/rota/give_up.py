"""Give-up hooks (docs/design.md, "Give-up hooks"): the registry of a queue's hooks by
job type, and running the hooks owed.

A job that ends ``failed`` by any path (fail, stuck, deferral cap, cancel) owes its
type's hook (``give_up_pending``). The hook runs inside the transaction that locks the
row and clears the flag, with that transaction's connection: what it writes commits
with the record, exactly once; a hook that raises rolls back and stays owed.

:class:`GiveUpHooks` takes what it needs (the store, a way to get a connection, the
tracer), not the :class:`rota.Queue`, which holds one and exposes it
(``Queue.on_give_up``, ``Queue.give_up_hooks``, ``Queue.run_give_up_hooks``).
"""

from __future__ import annotations

import logging
from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import MappingProxyType

from . import statements as sql
from . import tracing
from .job import Job
from .job import no_give_up_hook as _no_give_up_hook
from .store import AnyConn, Store

log = logging.getLogger("rota.queue")

#: ``async def hook(job, conn)``: what a job type does when one of its jobs gives up.
GiveUpHook = Callable[[Job, AnyConn], Awaitable[None]]
#: A connection: the one given (``conn=``), else one of the queue's pool, committed on
#: exit (:meth:`rota.Queue.connection`).
Connect = Callable[[AnyConn | None], AbstractAsyncContextManager[AnyConn]]


class GiveUpHooks:
    """A queue's give-up hooks by job type, and the runs of those owed.

    Args:
        store: runs the statements (``give_up_owed``, ``give_up_lock``,
            ``give_up_done``).
        connect: gives a connection (``connect(None)``: one of the queue's pool).
        tracer: a span per hook run (:mod:`rota.tracing`).
        hooks: the registry (type -> hook); a new empty one by default.
    """

    def __init__(self, store: Store, connect: Connect, tracer: tracing.Tracer,
                 hooks: MutableMapping[str, GiveUpHook] | None = None) -> None:
        self.store = store
        self.connect = connect
        self.tracer = tracer
        self._hooks: MutableMapping[str, GiveUpHook] = {} if hooks is None else hooks

    @property
    def view(self) -> Mapping[str, GiveUpHook]:
        """The hooks by job type, read-only (a live view)."""
        return MappingProxyType(self._hooks)

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def register(self, job_type: str, hook: GiveUpHook) -> None:
        """Set ``job_type``'s hook (the caller checked the type)."""
        self._hooks[job_type] = hook

    def over(self, hooks: Mapping[str, GiveUpHook | None]) -> GiveUpHooks:
        """A registry with ``hooks`` laid over this one, which it reads live (a pipeline's
        stages' hooks: :meth:`rota.Queue.with_stage_rules`). A type given ``None`` runs
        this registry's hook if it has one, else a no-op, so its give-ups are recorded
        as handled instead of owed forever.

        Returns:
            The new :class:`GiveUpHooks` on the same store, connections and tracer.
        """
        chained: MutableMapping[str, GiveUpHook] = ChainMap(
            {t: h for t, h in hooks.items() if h is not None}, self._hooks,
            {t: _no_give_up_hook for t, h in hooks.items() if h is None})
        return GiveUpHooks(self.store, self.connect, self.tracer, chained)

    async def run(self, ids: Sequence[int] | None = None, *, limit: int = 1000) -> int:
        """Run owed give-up hooks (for ``ids`` only, when given) for the types this
        registry has hooks for; jobs of other types stay owed for a process that has
        them. A hook that raises is logged and stays owed.

        Args:
            ids: job ids to consider, or ``None`` for any.
            limit: at most this many owed jobs are read.

        Returns:
            How many hooks ran and were recorded.
        """
        if not self._hooks:
            return 0
        async with self.connect(None) as c:
            owed = await sql.give_up_owed(self.store, types=list(self._hooks),
                                          ids=list(ids) if ids else None, limit=limit,
                                          conn=c)
        ran = 0
        for job_id in owed:
            try:
                if await self._run_one(job_id):
                    ran += 1
            except Exception:
                log.exception("give-up hook for job %s raised; it stays owed", job_id)
        return ran

    async def _run_one(self, job_id: int) -> bool:
        async with self.connect(None) as c, c.transaction():
            row = await sql.give_up_lock(self.store, id=job_id, conn=c)
            if row is None:  # already handled, or a concurrent sweeper has it
                return False
            # A row that cannot be read still gave up: its hook runs with the
            # Unreadable values in the job (docs/design.md, "Give-up hooks").
            job = Job.from_row(row, lenient=True)
            with self.tracer.give_up(job):
                await self._hooks[job.type](job, c)
            await sql.give_up_done(self.store, id=job_id, conn=c)
        return True


__all__ = ["Connect", "GiveUpHook", "GiveUpHooks"]
