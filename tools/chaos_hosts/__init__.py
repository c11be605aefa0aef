"""Workers on several hosts (``make chaos-hosts``): network partitions, a slow link, a
SIGKILL and a PostgreSQL restart, then proof that nothing was lost or doubled, that a
cut-off worker's late transitions were fenced, and that every schedule tick fired once.

What happens::

    python -m tools.chaos_hosts            # default profile: 4 hosts, ~2,000 jobs
    python -m tools.chaos_hosts --short    # the profile tests/test_chaos_hosts.py runs

It needs root (network namespaces, iptables). Everything it creates is removed on exit,
also when it fails, and by the next run if it was SIGKILLed (:mod:`~tools.chaos_hosts.net`).

1. A bridge with a private /24 (10.213.x.0/24, the first one free) and one network
   namespace per host, each joined to the bridge by a veth pair; the namespaces have
   no other interface and no route out. A throwaway PostgreSQL listens on the bridge
   address only (:mod:`~tools.chaos_hosts.server`).
2. Each host runs ``rota worker`` processes (``--app tools.chaos_hosts.app:app``): the
   chaos pipeline of :mod:`tools.chaos` (handlers that fail, defer and write side
   effects at random; triggers that log every claim and transition), with the chaos
   run's compressed durations (a 6 s stale window, a 1 s heartbeat). Each reaches the
   database only over its own link.
3. The scenario, one fault at a time, each once a wave of new jobs has the host it
   strikes holding running jobs:

   - a long cut (iptables DROP both ways, inside the host) of 12 s, twice the stale
     window: other hosts reclaim its jobs; when the link returns, the statements it
     had sent land (TCP retransmits them), its handlers finish, and their complete,
     fail, defer and release are refused by the claim token;
   - a short cut of 2 s: its heartbeats land late but inside the stale window, nothing
     is reclaimed, its work finishes;
   - 200 ms of latency and 5 % loss on a third host's link (tc netem; where the kernel
     has no netem, an iptables ``statistic`` drop and a delaying NFQUEUE reader,
     :mod:`~tools.chaos_hosts.nfqueue`), with jobs arriving all along;
   - a SIGKILL of one worker (another starts on its host), then one restart of
     PostgreSQL;
   - beside them, in a host with no workers, a probe measures how long connections with
     rota's default timeouts take to give up over a cut link (:mod:`~tools.chaos_hosts.probe`).
4. The workers are stopped, the rest drained as in the chaos run, and the checks run:
   the chaos run's (:mod:`tools.chaos.checks`, which explain each reclaim, overlapping
   handler and repeated side effect by a kill, the restart or a cut), and this run's
   (:mod:`~tools.chaos_hosts.checks`): claims ended only by their holder, what each
   fault did, the probe's bounds, the schedule's ticks.

The last line is the summary (one line; wrapped here)::

    hosts=4 partitions=2 lost=0 duplicated=12 hooks_missing=0 hooks_doubled=0 \
    schedule_ticks=2 schedule_fired=2

It exits 1 unless ``lost``, ``hooks_missing`` and ``hooks_doubled`` are 0, every tick
owed fired exactly once (``schedule_fired == schedule_ticks``) and no check found a
violation; each duplicate is listed with its reason (``--verbose``: all of them). The
workers' pipeline declares a schedule firing every minute; the run owes one tick per
minute it spans (:mod:`~tools.chaos_hosts.schedules`).
"""
