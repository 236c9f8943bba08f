"""Static checks as tests: ``ruff check .`` (the rules in pyproject.toml) and ``mypy`` on the public API.

Both run as subprocesses from the repository root with the configuration in
pyproject.toml, exactly as a developer would type them, and a failure shows
their output.  mypy reads torch's and numpy's type information on a cold
cache (~50 s of CPU on 2 cores), hence ``slow``; ruff takes well under a second.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed: pip install -e '.[test]' (setup.py's test extra pins it)")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_ruff_finds_nothing():
    # --no-cache: nothing written into the working tree
    proc = _run("ruff", "check", ".", "--no-cache", "--output-format", "concise", timeout=120)
    assert proc.returncode == 0, f"python -m ruff check . found:\n{proc.stdout}{proc.stderr}"


def test_ruff_catches_what_it_is_configured_for(tmp_path):
    """The configuration is live: each selected family flags its example (else the test above proves nothing)."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\n"                                   # F401 unused import
        "def f(x=[]):\n"                                # B006 mutable default
        "    return undefined_name + eval('1')\n",      # F821 undefined name, S307 eval
        encoding="utf-8")
    proc = _run("ruff", "check", str(bad), "--no-cache", "--output-format", "concise",
                "--config", str(ROOT / "pyproject.toml"), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for code in ("F401", "B006", "F821", "S307"):
        assert code in proc.stdout, f"{code} not reported:\n{proc.stdout}"


@pytest.mark.slow
def test_mypy_finds_nothing(tmp_path):
    # the files to check come from [tool.mypy] in pyproject.toml; the cache goes to a temporary folder
    proc = _run("mypy", "--cache-dir", str(tmp_path / "mypy-cache"), timeout=900)
    assert proc.returncode == 0, f"python -m mypy found:\n{proc.stdout}{proc.stderr}"
    assert "no issues found" in proc.stdout
