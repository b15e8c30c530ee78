"""The shape of the tree: layering contracts (import-linter) and the design document's map."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"


def test_import_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter), "--config", str(ROOT / "pyproject.toml")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def _design_module_paths() -> list[str]:
    """Every `mink/...` path named in design.md's tables (rows starting with '|')."""
    paths = []
    for line in DESIGN.read_text().splitlines():
        if line.startswith("|"):
            paths += re.findall(r"`((?:mink|chaos)/[\w/.]+)`", line)
    return paths


def test_every_module_in_the_design_map_exists():
    paths = _design_module_paths()
    assert len(paths) >= 30, "the map in docs/design.md lost its rows"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/design.md names modules that do not exist: {missing}"


def test_the_map_answers_the_questions_it_must():
    text = DESIGN.read_text()
    for question in ("where does a Produce go", "where does a batch become durable",
                     "what runs only on the cluster coordinator",
                     "where do group state and committed offsets live",
                     "where will transactions live", "where will quotas live"):
        assert question in text, question
    assert "### The fences" in text


def test_nothing_refers_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".sql", ".txt", ""} or not path.is_file():
            continue
        if "../" + "shared" in path.read_text(errors="replace"):
            offenders.append(name)
    assert not offenders, f"files referring outside the repository: {offenders}"
