"""The README's 20-line example runs as written (against this test's database)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg

from rota.cli import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(database_url: str, schema: str) -> None:
    text = README.read_text()
    code = re.search(r"## The queue in 20 lines\s+```python\n(.*?)```", text, re.S)
    assert code is not None
    source = code.group(1).replace('schema="rota"', f'schema="{schema}"').replace(
        '"postgresql://postgres@127.0.0.1:5432/test"', repr(database_url))
    # Every line of the block counts, blank ones too: the heading's promise, kept
    # (it was 22 lines under a heading of 20).
    assert len(code.group(1).splitlines()) <= 20
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "searching {'q': 'trail running'}\n"
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f'SELECT status, attempts FROM "{schema}".jobs').fetchall()
    assert row == [("done", 1)]


def test_readme_smallest_app_runs_under_the_cli(database_url: str, schema: str,
                                                tmp_path: Path) -> None:
    """The README's smallest `--app` (myapp.py) runs a job enqueued from the CLI."""
    text = README.read_text()
    code = re.search(r"```python\n# myapp.py\n(.*?)```", text, re.S)
    assert code is not None
    (tmp_path / "myapp.py").write_text(code.group(1))
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
           "DATABASE_URL": database_url, "ROTA_SCHEMA": schema,
           "PYTHONPATH": str(tmp_path)}
    rota = [sys.executable, "-m", "rota.cli"]
    for args in (["migrate"], ["enqueue", "t", '{"hello": "world"}']):
        done = subprocess.run([*rota, *args], capture_output=True, text=True, timeout=60,
                              env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    out = subprocess.run([*rota, "run", "--app", "myapp:build", "--budget", "5", "--json"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("{'hello': 'world'}\n"), out.stdout
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(f'SELECT type, status FROM "{schema}".jobs').fetchall()
    assert rows == [("t", "done")]


def test_readme_embedded_server_example_runs(tmp_path: Path) -> None:
    """The README's EmbeddedServer example, as written, in its own process: the server
    starts, the queue migrates on it, and it is gone afterwards."""
    text = README.read_text()
    code = re.search(r"development scripts or tests \(`pip install 'rota\[embedded\]'`\):\s+"
                     r"```python\n(.*?)```", text, re.S)
    assert code is not None
    lines = code.group(1).splitlines()
    imports = [line for line in lines if line.startswith("from ")]
    body = [line for line in lines if line and not line.startswith("from ")]
    body = [line.replace("...", "print(await queue.now() is not None, "
                                 "os.path.isdir(server.directory)); seen = server.directory")
            for line in body]
    source = "\n".join([*imports, "import asyncio, os", "async def main():",
                        *(f"    {line}" for line in body),
                        "    print(os.path.isdir(seen))", "asyncio.run(main())"])
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path, env={"PATH": "/usr/bin:/bin",
                                                          "TMPDIR": "/tmp"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "True True\nFalse\n"


def test_readme_gives_rota_schedules_the_app_it_needs() -> None:
    """`rota schedules` lists the app's schedules and refuses to run without one: every
    mention of it in the README and the operations guide shows its --app."""
    [option] = [p for p in cli.commands["schedules"].params if p.name == "app_spec"]
    assert (option.opts, option.envvar, option.metavar) == (["--app"], "ROTA_APP",
                                                            "MODULE:ATTR")
    text = README.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| inspection |"))
    assert "`rota schedules --app MODULE:ATTR`" in row
    for path in (README, README.parent / "docs" / "operations.md"):
        mentions = re.findall(r"`rota schedules[^`]*`", path.read_text())
        assert mentions and all("--app " in m for m in mentions), (path, mentions)


def test_readme_says_a_queue_in_another_schema_needs_it_on_every_command() -> None:
    """The sentence where the README introduces the CLI, with the names the CLI reads
    (the schema option's flag and environment variable)."""
    [option] = [p for p in cli.commands["jobs"].params if p.name == "schema"]
    assert (option.opts, option.envvar) == (["--schema"], "ROTA_SCHEMA")
    section = README.read_text().split("## Running it\n", 1)[1].split("\n|", 1)[0]
    assert " ".join(section.split()) == (
        "Every `rota` command works on the schema `rota` unless told otherwise: for a "
        "queue in another schema (`Queue(url, schema=\"billing\")`), give every command, "
        "`rota migrate` included, `ROTA_SCHEMA=billing` or `--schema billing`.")
