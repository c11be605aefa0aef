"""Hosts as Linux network namespaces on a bridge of their own, and the faults on their
links: a cut (iptables DROP both ways), and latency with loss (tc netem; where the
kernel has no netem, the same with an iptables ``statistic`` drop and a delaying
NFQUEUE reader, :mod:`tools.chaos_hosts.nfqueue`).

Everything this module creates is named ``rh<pid>-…`` (the pid of the harness that
made it) and recorded in a state file under ``/run/rota-chaos-hosts``, so a later run
removes what a run that died left behind (``sweep_leftovers``) without touching a run
still going. Traffic stays on the /24 the run creates: the namespaces have no other
interface and no default route, and the server listens on the bridge address only.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "rh"
STATE_DIR = Path("/run/rota-chaos-hosts")
NAMED = re.compile(rf"^{PREFIX}(\d+)-")
SUBNETS = "10.213.{}.0/24"  # the first of 10.213.0-255.0/24 that no interface uses
NFQUEUE_NUM = 7
ROOT = Path(__file__).resolve().parents[2]


class NetworkUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no CAP_NET_ADMIN, no ``ip``)."""


def run(args: Sequence[str], *, check: bool = True,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(args), capture_output=True, text=True, check=check,
                              timeout=timeout)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{' '.join(args)}: {exc.stderr.strip() or exc}") from None


def require_network_admin() -> None:
    """Raises NetworkUnavailable with what is missing."""
    missing = [tool for tool in ("ip", "iptables", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetworkUnavailable(
            f"{', '.join(missing)} not found: install iproute2 and iptables "
            "(.ci/run does: apt-get install -y iproute2 iptables)")
    if os.geteuid() != 0:
        raise NetworkUnavailable("network namespaces need root (CAP_NET_ADMIN): run as root")
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        raise NetworkUnavailable(f"cannot create a network namespace: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_names() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = run(["ip", "-o", "link", "show"], check=False).stdout
    return [m.group(1) for m in re.finditer(r"^\d+:\s+([^:@\s]+)", out, re.M)]


def _kill_netns_processes(netns: str) -> None:
    """SIGKILL the processes left in one of our namespaces (a dead run's workers)."""
    out = run(["ip", "netns", "pids", netns], check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_postgres(state: dict[str, str]) -> None:
    """Stop a server a state file names (immediate: it is a leftover) and delete it."""
    pgdata, pg_bin, user = state.get("pgdata"), state.get("pg_bin"), state.get("pg_user")
    if pgdata and pg_bin and Path(pgdata, "postmaster.pid").exists():
        subprocess.run([str(Path(pg_bin, "pg_ctl")), "-D", pgdata, "-m", "immediate", "-w",
                        "stop"], capture_output=True, user=user or None, timeout=60)
    if pgdata:
        shutil.rmtree(pgdata, ignore_errors=True)
    if state.get("pg_placed"):  # the binaries' copy, when the installed ones were private
        shutil.rmtree(state["pg_placed"], ignore_errors=True)


def sweep_leftovers() -> list[str]:
    """Remove what runs that are no longer alive left behind: their processes, servers,
    namespaces and links. Returns what was removed."""
    removed = []
    if STATE_DIR.is_dir():
        for path in STATE_DIR.glob("*.json"):
            if _alive(int(path.stem)):
                continue
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(path.read_text())
                for netns in state.get("netns", []):
                    _kill_netns_processes(netns)
                stop_postgres(state)
                removed.append(f"server {state.get('pgdata')}")
            path.unlink(missing_ok=True)
    for netns in _netns_names():
        m = NAMED.match(netns)
        if m and not _alive(int(m.group(1))):
            _kill_netns_processes(netns)
            run(["ip", "netns", "del", netns], check=False)
            removed.append(f"netns {netns}")
    for link in _link_names():
        m = NAMED.match(link)
        if m and not _alive(int(m.group(1))):
            run(["ip", "link", "del", link], check=False)
            removed.append(f"link {link}")
    return removed


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    out = run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    out += run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout
    used = [ipaddress.ip_network(m, strict=False)
            for m in re.findall(r"(\d+\.\d+\.\d+\.\d+/\d+)", out)]
    for k in range(256):
        net = ipaddress.IPv4Network(SUBNETS.format(k))
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetworkUnavailable("no free /24 in 10.213.0.0/16")


@dataclass
class Host:
    """One "host": a namespace whose only interface (``eth0``) is one end of a veth pair;
    the other end is on the bridge where the database listens."""

    name: str
    netns: str
    veth: str
    address: str
    faults: list[str] = field(default_factory=list)

    def prefix(self) -> list[str]:
        """The command prefix that runs a command inside this host."""
        return ["ip", "netns", "exec", self.netns]


class Network:
    """A bridge with ``hosts`` namespaces on it (``with Network(3) as net``), removed on
    exit, at interpreter exit, and by the next run if this one is SIGKILLed."""

    def __init__(self, hosts: int | Sequence[str]) -> None:
        self.names = ([f"h{i}" for i in range(1, hosts + 1)] if isinstance(hosts, int)
                      else list(hosts))
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{self.tag}-br"
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""
        self.state: dict[str, object] = {"pid": os.getpid(), "netns": [], "links": []}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._delayers: dict[str, subprocess.Popen[bytes]] = {}
        self._netem: bool | None = None
        self._up = False

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Network:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def state_path(self) -> Path:
        return STATE_DIR / f"{os.getpid()}.json"

    def save_state(self, **extra: str) -> None:
        self.state.update(extra)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.state_path.write_text(json.dumps(self.state))

    def up(self) -> None:
        require_network_admin()
        atexit.register(self.down)
        self._up = True
        with _locked():
            sweep_leftovers()
            self.subnet = _free_subnet()
            addresses = list(self.subnet.hosts())
            self.gateway = str(addresses[0])
            self.state["subnet"] = str(self.subnet)
            self.state["links"] = [self.bridge]
            self.save_state()
            run(["ip", "link", "add", self.bridge, "type", "bridge"])
            run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
            run(["ip", "link", "set", self.bridge, "up"])
            for i, name in enumerate(self.names, start=1):
                host = Host(name, f"{self.tag}-{name}", f"{self.tag}-{i}",
                            str(addresses[9 + i]))
                self.state["netns"] = [*self._list("netns"), host.netns]
                self.state["links"] = [*self._list("links"), host.veth]
                self.save_state()
                run(["ip", "netns", "add", host.netns])
                run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                     "netns", host.netns])
                run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
                run([*host.prefix(), "ip", "addr", "add", f"{host.address}/24", "dev", "eth0"])
                run([*host.prefix(), "ip", "link", "set", "eth0", "up"])
                run([*host.prefix(), "ip", "link", "set", "lo", "up"])
                self.hosts[name] = host

    def _list(self, key: str) -> list[str]:
        value = self.state.get(key)
        return [str(v) for v in value] if isinstance(value, list) else []

    def spawn(self, host: str, args: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``args`` inside ``host``; stopped (SIGKILL) by :meth:`down` if still up."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            [*self.hosts[host].prefix(), *args], **kwargs)
        self.procs.append(proc)
        return proc

    def down(self) -> None:
        """Remove everything (idempotent): processes started in the hosts, namespaces,
        links, the state file; a server registered in the state is stopped first by its
        owner (this only sweeps one left running)."""
        if not self._up:
            return
        self._up = False
        for proc in [*self.procs, *self._delayers.values()]:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        for netns in self._list("netns"):
            _kill_netns_processes(netns)
            run(["ip", "netns", "del", netns], check=False)
        for link in reversed(self._list("links")):
            if link in _link_names():
                run(["ip", "link", "del", link], check=False)
        if self.state.get("pgdata"):
            stop_postgres({k: str(v) for k, v in self.state.items() if isinstance(v, str)})
        self.state_path.unlink(missing_ok=True)

    # -- faults ------------------------------------------------------------------------

    def _iptables(self, host: Host, action: str, rule: Sequence[str]) -> None:
        run([*host.prefix(), "iptables", "-w", action, *rule])

    def _cut_rules(self) -> list[list[str]]:
        return [["OUTPUT", "-d", self.gateway, "-j", "DROP"],
                ["INPUT", "-s", self.gateway, "-j", "DROP"]]

    def cut(self, name: str) -> None:
        """Drop every packet between the host and the database, both ways."""
        host = self.hosts[name]
        for rule in self._cut_rules():
            self._iptables(host, "-A", rule)
        host.faults.append("cut")

    def slow(self, name: str, delay_ms: float, loss: float = 0.0) -> str:
        """Add ``delay_ms`` to every packet the host sends and drop a ``loss`` fraction of
        them, as ``tc qdisc add dev eth0 root netem delay … loss …`` does. Returns how:
        ``netem``, or ``nfqueue`` where the kernel has no netem."""
        host = self.hosts[name]
        if self.has_netem(name):
            run([*host.prefix(), "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
                 "delay", f"{delay_ms:g}ms"] + (["loss", f"{loss * 100:g}%"] if loss else []))
            host.faults.append("netem")
            return "netem"
        if delay_ms > 0:
            self.start_delayer(name, delay_ms)
        for rule in self._slow_rules(delay_ms, loss):
            self._iptables(host, "-A", rule)
        host.faults.append(f"nfqueue:{delay_ms:g}:{loss:g}")
        return "nfqueue"

    def has_netem(self, name: str) -> bool:
        """Whether the kernel has tc's netem (tried once, on the host's loopback)."""
        if self._netem is None:
            prefix = self.hosts[name].prefix()
            self._netem = run([*prefix, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                               "delay", "1ms"], check=False).returncode == 0
            if self._netem:
                run([*prefix, "tc", "qdisc", "del", "dev", "lo", "root"], check=False)
        return self._netem

    def start_delayer(self, name: str, delay_ms: float) -> None:
        """Start the NFQUEUE delayer in the host ahead of :meth:`slow` (a Python process
        takes a moment to start); nothing reaches it before the rule is added."""
        if name in self._delayers:
            return
        host = self.hosts[name]
        delayer = self._delayers[name] = subprocess.Popen(
            [*host.prefix(), sys.executable, "-m", "tools.chaos_hosts", "delay",
             "--queue", str(NFQUEUE_NUM), "--ms", f"{delay_ms:g}"],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        assert delayer.stdout is not None
        line = delayer.stdout.readline()
        if not line.startswith(b"bound"):
            rest = delayer.communicate(timeout=10)[0] or b""
            raise RuntimeError(f"the NFQUEUE delayer did not start: "
                               f"{(line + rest).decode(errors='replace').strip()}")

    def _slow_rules(self, delay_ms: float, loss: float) -> list[list[str]]:
        rules = []
        if loss:
            rules.append(["OUTPUT", "-d", self.gateway, "-m", "statistic", "--mode",
                          "random", "--probability", f"{loss:g}", "-j", "DROP"])
        if delay_ms > 0:
            rules.append(["OUTPUT", "-d", self.gateway, "-j", "NFQUEUE", "--queue-num",
                          str(NFQUEUE_NUM), "--queue-bypass"])
        return rules

    def heal(self, name: str) -> None:
        """Undo the host's faults: its link is as it was made."""
        host = self.hosts[name]
        while host.faults:
            fault = host.faults.pop()
            if fault == "cut":
                for rule in self._cut_rules():
                    self._iptables(host, "-D", rule)
            elif fault == "netem":
                run([*host.prefix(), "tc", "qdisc", "del", "dev", "eth0", "root"])
            else:
                _, delay, loss = fault.split(":")
                for rule in self._slow_rules(float(delay), float(loss)):
                    self._iptables(host, "-D", rule)
                delayer = self._delayers.pop(name, None)
                if delayer is not None:  # it lets what it holds go, then exits
                    delayer.send_signal(signal.SIGTERM)
                    try:
                        delayer.wait(10)
                    except subprocess.TimeoutExpired:
                        delayer.kill()
                        delayer.wait()
