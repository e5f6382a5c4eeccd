"""Helpers the simulator's tests (and ``json_snapshots.py``) share."""

from __future__ import annotations

import random
from pathlib import Path


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
