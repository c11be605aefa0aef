"""The README's 20-line example runs as written (against this test's database)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg

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
