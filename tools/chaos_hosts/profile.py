"""How big and how violent a multi-host run is (the default for ``make chaos-hosts``,
the short one for tests/test_chaos_hosts.py). The workload and its compressed
durations are :class:`tools.chaos.profile.Profile`'s."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rota import ConfigError

from ..chaos.profile import Profile


@dataclass(frozen=True)
class HostsProfile:
    """A multi-host run.

    Attributes:
        workload: the chaos pipeline's profile: handler latency, error and defer rates,
            and the compressed stale window, platform timeout, heartbeat and budget.
            Its ``jobs`` are the jobs seeded before the workers start.
        hosts: namespaces with workers (a fifth, worker-less one holds the probe).
        workers_per_host: ``rota worker`` processes on each.
        wave: jobs enqueued before each fault, so that every fault finds work running.
        long_cut: seconds a host is cut off, longer than the stale window (its jobs are
            reclaimed; what it sent lands when the link returns, and is fenced).
        long_cut_max: the long cut goes on past ``long_cut`` until another host has
            reclaimed one of its jobs, at most this long (under rota's 30 s give-up,
            so what it sent still lands, and meets the fence).
        short_cut: seconds another host is cut off, well inside the stale window (its
            heartbeats land late but in time: nothing is reclaimed).
        slow_seconds, slow_delay_ms, slow_loss: a third host's link delays what it
            sends by ``slow_delay_ms`` and drops ``slow_loss`` of it, for this long.
        pause: seconds between two faults.
        probe: measure how long a connection with rota's default timeouts takes to give
            up over a cut link (about 40 s, beside the rest).
        deadline: seconds for the worker phase; what is open then is drained.
    """

    workload: Profile
    hosts: int = 3
    workers_per_host: int = 2
    wave: int = 60
    long_cut: float = 12.0
    long_cut_max: float = 24.0
    short_cut: float = 2.0
    slow_seconds: float = 8.0
    slow_delay_ms: float = 200.0
    slow_loss: float = 0.05
    pause: float = 2.0
    probe: bool = True
    deadline: float = 150.0

    def __post_init__(self) -> None:
        w = self.workload
        if self.hosts < 3:
            raise ConfigError("a multi-host run needs at least 3 hosts (one cut long, one "
                              "cut short, one slowed)")
        if not w.stale_after + w.heartbeat_every < self.long_cut <= self.long_cut_max:
            raise ConfigError(f"long_cut ({self.long_cut}s) must outlast the stale window "
                              f"({w.stale_after}s) and a heartbeat, and be at most "
                              f"long_cut_max ({self.long_cut_max}s)")
        # A statement sent during a cut is retransmitted with exponential backoff, so it
        # can land up to about the cut's length after the link returns.
        if 2 * self.short_cut + w.heartbeat_every >= w.stale_after:
            raise ConfigError(f"short_cut ({self.short_cut}s) must stay well inside the "
                              f"stale window ({w.stale_after}s): twice it plus a heartbeat")

    @property
    def jobs(self) -> int:
        """Seeded jobs, the waves' included (drafts come on top)."""
        return self.workload.jobs + 4 * self.wave

    def with_jobs(self, jobs: int) -> HostsProfile:
        """The same run with about ``jobs`` seeded jobs, a third of them before the start
        and the rest in the four waves."""
        first = max(jobs // 3, 1)
        return replace(self, workload=replace(self.workload, jobs=first),
                       wave=max((jobs - first) // 4, 1))


DEFAULT_PROFILE = HostsProfile(
    Profile(jobs=800, latency_ms=(10.0, 120.0)), hosts=4, wave=300, slow_seconds=15.0,
    deadline=240.0)
SHORT_PROFILE = HostsProfile(
    Profile(jobs=100, latency_ms=(10.0, 120.0)), hosts=3, wave=60, slow_seconds=8.0,
    deadline=100.0)
