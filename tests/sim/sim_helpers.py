"""Helpers the simulator's tests (and ``json_snapshots.py``) share."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from prioqueue.cli import main


def written(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path``; return ``path`` (a config or worker file)."""
    path.write_text(text, encoding="utf-8")
    return path


def simulate_json(tmp_path: Path, *argv: str) -> Any:
    """Run ``prioqueue simulate ARGV --json FILE`` (it must exit 0); return FILE's report."""
    out = tmp_path / "report.json"
    assert main(["simulate", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def synthetic_azure(path: Path, rows: int = 300) -> None:
    """Write an Azure LLM inference 2023 CSV of ``rows`` random requests (seeded) to ``path``."""
    rng = random.Random(3)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    t = 0.0
    for _ in range(rows):
        t += rng.expovariate(1 / 4.0)
        seconds = int(t)
        micro = int((t - seconds) * 1e7)
        lines.append(
            f"2023-11-16 18:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{micro:07d},"
            f"{rng.randrange(50, 4000)},{rng.randrange(1, 400)}"
        )
    path.write_bytes("\r\n".join(lines).encode())


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/NAME.py`` as module ``name`` (benchmarks/ first on the path, so a
    benchmark that imports another finds it)."""
    directory = Path(__file__).resolve().parents[2] / "benchmarks"
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
