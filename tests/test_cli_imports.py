"""What a mink process imports: never Hypothesis, which kio would import where it is installed
and which puts trio's scheduler in its deterministic test mode for the whole process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _imported(command: list[str]) -> set[str]:
    """The modules `command` (a Python program) imports, from -X importtime's report."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def test_hypothesis_is_installed_here_and_kio_imports_it():
    """The premise: without mink's entry points keeping it out, importing the CLI pulls
    Hypothesis in (through kio) and switches trio's scheduler to its test mode."""
    pytest.importorskip("hypothesis")
    code = ("import mink.cli.main, sys, trio._core._run as run; "
            "assert 'hypothesis' in sys.modules; "
            "assert run._ALLOW_DETERMINISTIC_SCHEDULING")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("entry", ["module", "script"])
def test_the_mink_command_does_not_import_hypothesis(entry):
    pytest.importorskip("hypothesis")
    if entry == "module":
        command = [sys.executable, "-m", "mink.cli", "serve", "--help"]
    else:
        script = Path(sys.executable).parent / "mink"
        if not script.exists():
            pytest.skip("mink is not installed as a console script in this environment")
        command = [str(script), "serve", "--help"]
    imported = _imported(command)
    assert "mink.cli.main" in imported and "kio" in imported  # it got as far as kio
    assert "hypothesis" not in imported


def test_a_node_process_keeps_trio_out_of_its_test_mode():
    """What `mink serve` runs under: kio imported, the scheduler as in production."""
    pytest.importorskip("hypothesis")
    code = ("from mink.cli import keep_hypothesis_out; keep_hypothesis_out(); "
            "import mink.broker.node, sys, trio._core._run as run; "
            "assert 'kio' in sys.modules and sys.modules.get('hypothesis') is None; "
            "assert not run._ALLOW_DETERMINISTIC_SCHEDULING")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
