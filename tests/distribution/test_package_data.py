"""Every data file the package reads is in its wheel: pyproject's package-data patterns cover each
non-Python file under magi2studio/ (an editable install reads the tree, so only the image's wheel
install would miss one: the studio's studio.js once kept the image's studio from starting)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _patterns() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["setuptools"]["package-data"]["magi2studio"]


def _covered(relative: str, patterns: list[str]) -> bool:
    # setuptools' "**/" also matches the package's top folder.
    return any(fnmatch.fnmatch(relative, p) or (p.startswith("**/") and fnmatch.fnmatch(relative, p[3:]))
               for p in patterns)


def test_every_data_file_of_the_package_is_in_its_wheel():
    patterns = _patterns()
    package = ROOT / "magi2studio"
    files = [p.relative_to(package).as_posix() for p in package.rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert files, "no data files found: the test reads the wrong folder"
    missing = [f for f in files if not _covered(f, patterns)]
    assert not missing, f"not in pyproject's package-data, so not in the wheel: {missing}"


def test_the_check_would_see_a_missing_pattern():
    assert not _covered("studio/assets/studio.js", [p for p in _patterns() if p != "**/*.js"])
