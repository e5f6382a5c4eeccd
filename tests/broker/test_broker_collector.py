"""The serving process's garbage collector (``_service.serving.tune_collector``, issue 21).

Run in a child process: the settings are process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, weakref
from prioqueue._service.serving import GC_THRESHOLDS, tune_collector

kept = [[i] for i in range(5000)]          # what a start made: frozen, still alive
tune_collector()
frozen = gc.get_freeze_count()


class Node:
    pass


a, b = Node(), Node()                      # a cycle made after: still collected
a.other, b.other = b, a
ref = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({
    "thresholds": list(gc.get_threshold()), "expected": list(GC_THRESHOLDS),
    "frozen": frozen, "cycle_collected": ref() is None, "kept": len(kept),
}))
"""


def test_the_collector_is_tuned_and_still_collects_cycles() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True
    )
    out = json.loads(done.stdout)
    assert out["thresholds"] == out["expected"]
    assert out["expected"][0] > 700  # rarer than Python's default first generation
    assert out["frozen"] >= 5000  # what existed at the call is out of the scans
    assert out["cycle_collected"]
    assert out["kept"] == 5000
