"""The README stays a short path in (issue 33: it had grown to 249 lines; reference material lives in docs/):
at most 200 lines, a runnable example of every ``python -m`` command, and links that resolve."""
from __future__ import annotations

import re
from pathlib import Path

from test_imports import is_entry_point, project_modules

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAX_LINES = 200


def test_readme_fits_its_limit():
    n = len(README.splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (limit {MAX_LINES}): move reference material to docs/"


def test_readme_has_an_example_of_every_command():
    commands = {m.removesuffix(".__main__") for m in project_modules() if is_entry_point(m)}
    missing = sorted(c for c in commands if not re.search(rf"python -m {re.escape(c)} \S", README))
    assert not missing, f"README.md has no example of: {missing}"


def test_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert targets
    broken = sorted({t for t in targets if "://" not in t and not (ROOT / t).exists()})
    assert not broken, f"README.md links to missing files: {broken}"
