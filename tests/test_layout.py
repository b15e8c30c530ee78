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


def test_no_name_is_used_that_does_not_exist():
    """pyflakes' undefined-name checks over the code (ruff's F821-F823): a handler once
    called a function it never imported, and only a client's own test suite found it."""
    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run(
        [str(ruff), "check", "--isolated", "--no-fix", "--output-format", "concise",
         "--select", "F821,F822,F823", "mink", "benchmarks", "chaos"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


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
                     "where is the transaction coordinator",
                     "where are client quotas decided"):
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


def _private_members(cls_node) -> set[str]:
    """The `_name` members a class defines: its methods and the `self._name` it assigns."""
    import ast

    names = set()
    for item in ast.walk(cls_node):
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store) and (
                isinstance(item.value, ast.Name) and item.value.id == "self"):
            names.add(item.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_nothing_outside_the_postgres_module_touches_the_metadata_store_s_private_parts():
    """The control plane's face is its public operations (and `fetch_one`/`fetch_all` for the
    operation modules beside it): a `store._one(...)` elsewhere is a hole in that face."""
    import ast

    home = ROOT / "mink" / "storage" / "controlplane" / "postgres.py"
    [store] = [n for n in ast.walk(ast.parse(home.read_text()))
               if isinstance(n, ast.ClassDef) and n.name == "MetadataStore"]
    private = _private_members(store)
    assert {"_run", "_pool"} <= private  # the scan sees the class
    offenders = []
    for folder in ("mink", "tests", "chaos", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == home:
                continue
            tree = ast.parse(path.read_text(), str(path))
            subclasses = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", None)) == "MetadataStore" for b in n.bases)}
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                if cls.name in subclasses:  # a subclass must not use them either
                    for n in ast.walk(cls):
                        if (isinstance(n, ast.Attribute) and n.attr in private
                                and n.attr not in _private_members(cls)):
                            offenders.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.attr}")
            for n in ast.walk(tree):
                if (isinstance(n, ast.Attribute) and n.attr in private
                        and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))):
                    offenders.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.attr}")
    assert not offenders, f"private members of MetadataStore used outside postgres.py: {offenders}"
