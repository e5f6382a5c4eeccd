"""The tests session's coverage gate (noxfile.py) holds where pytest-cov's rounding let it pass.

The tests session was once reported green while pytest-cov printed "FAIL Required test
coverage of 95% not reached": pytest-cov (and ``coverage report``) round the total to the
configured precision, 0 by default, before comparing it, so 94.74 % passed a floor of 95. The
gate reads ``coverage json``'s unrounded total. Here real coverage runs (in a subprocess, on a
module of 19 statements) give the totals the gate judges.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("nox")


ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: str) -> ModuleType:
    """The module at ``path`` (from the repository root), loaded as ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


noxfile = _load("noxfile", "noxfile.py")  # not on the path under pytest (only tests/ is)


def _totals(tmp_path: Path, missed: int) -> dict[str, object]:
    """``coverage json``'s totals for a module of 17 statements, all run, and a function of
    ``missed`` statements never called."""
    body = [f"    a{i} = x + {i}" for i in range(15)]
    calls = ["def g():", *[f"    b{i} = {i}" for i in range(missed - 1)], "    return 0"]
    calls = calls if missed else []
    (tmp_path / "mod.py").write_text("\n".join(["def f(x):", *body, "    return a0", *calls, ""]))
    (tmp_path / "run.py").write_text("import mod\nmod.f(1)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COV_CORE")}
    env.pop("COVERAGE_PROCESS_START", None)
    coverage = [sys.executable, "-m", "coverage"]
    for args in (["run", "--branch", "--source=mod", "run.py"], ["json", "-q", "-o", "c.json"]):
        subprocess.run([*coverage, *args], cwd=tmp_path, env=env, check=True, timeout=120)
    totals: dict[str, object] = json.loads((tmp_path / "c.json").read_text())["totals"]
    return totals


def test_a_total_that_rounds_up_to_the_floor_fails_the_gate(tmp_path: Path) -> None:
    totals = _totals(tmp_path, missed=1)
    assert totals["percent_covered_display"] == "95"  # what a precision of 0 shows
    shortfall = noxfile.coverage_shortfall(totals, 95.0)
    assert shortfall == "coverage is 94.74 %, under the required 95 %"


def test_a_total_at_the_floor_passes_and_one_below_fails(tmp_path: Path) -> None:
    totals = _totals(tmp_path, missed=0)
    assert totals["percent_covered"] == 100.0
    assert noxfile.coverage_shortfall(totals, 100.0) is None
    assert noxfile.coverage_shortfall({**totals, "percent_covered": 94.999}, 95.0) is not None
    assert noxfile.coverage_shortfall({**totals, "percent_covered": 95.0}, 95.0) is None


def test_no_measurement_is_a_failure_not_a_pass() -> None:
    empty = {"num_statements": 0, "percent_covered": 100.0}
    assert "no coverage was measured" in str(noxfile.coverage_shortfall(empty, 95.0))
    assert "no totals" in str(noxfile.coverage_shortfall({}, 95.0))


def test_the_floor_is_pyprojects() -> None:
    assert noxfile.COVERAGE_FLOOR == 95.0


def test_every_quoted_sweep_is_a_picture_the_docs_session_draws() -> None:
    # The docs session hands the outputs of its picture commands to tests/sim/test_sim_docs.py;
    # a quoted sweep that is no picture would run a second time there.
    quotes = _load("sim_docs", "tests/sim/test_sim_docs.py")
    pictures = {" ".join(args[: args.index("--plot")]) for args in noxfile.PICTURES}
    sweeps = {" ".join(words[2:]) for words in quotes.COMMANDS if "--sweep" in words}
    assert sweeps
    assert sweeps <= pictures
