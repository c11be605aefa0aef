"""What ``pip install rota`` installs: the library alone; the example application is its
own distribution (``demo/``), which ``make demo`` installs (docs/design.md, "Where
things live")."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(tree: Path, out: Path) -> zipfile.ZipFile:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(tree)],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def top_level(wheel: zipfile.ZipFile) -> set[str]:
    return {n.split("/")[0] for n in wheel.namelist()
            if not n.split("/")[0].endswith((".dist-info", ".data"))}


def entry_points(wheel: zipfile.ZipFile) -> str:
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return wheel.read(name).decode()


@pytest.mark.timeout(600)
def test_the_library_wheel_holds_rota_alone(tmp_path: Path) -> None:
    # A copy of what the build reads, so the build leaves the checkout untouched.
    tree = tmp_path / "rota"
    shutil.copytree(ROOT / "src", tree / "src",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    wheel = build_wheel(tree, tmp_path / "dist")
    assert top_level(wheel) == {"rota"}
    assert entry_points(wheel) == "[console_scripts]\nrota = rota.cli:main\n"
    assert {"rota/fair/claim.sql", "rota/fair/bookkeeping.sql", "rota/fair/verify.sql",
            "rota/sql/complete.sql"} <= set(wheel.namelist())


@pytest.mark.timeout(600)
def test_the_demo_is_a_distribution_of_its_own(tmp_path: Path) -> None:
    tree = tmp_path / "demo"
    shutil.copytree(ROOT / "demo", tree, ignore=shutil.ignore_patterns(
        "*.egg-info", "__pycache__", "build"))
    wheel = build_wheel(tree, tmp_path / "dist")
    assert top_level(wheel) == {"rota_demo"}
    assert entry_points(wheel) == (
        "[console_scripts]\nrota-demo = rota_demo.__main__:main\n")
    assert {"rota_demo/schema.sql", "rota_demo/py.typed"} <= set(wheel.namelist())
    [meta] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in wheel.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    assert requires == ["Requires-Dist: rota", "Requires-Dist: httpx>=0.27"]
