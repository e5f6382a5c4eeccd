"""``prioqueue gateway`` tunes the garbage collector with the broker's helper (issue 30).

``_service.serving.tune_collector`` collects, freezes what exists once the app is built and
sets the gateway's thresholds; cycles made while serving are still collected, and an
in-process run puts the collector back. Run in a child process: the settings are
process-wide. The server's ``run`` is replaced by a probe (no port is served).
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, weakref
import uvicorn
from prioqueue.cli import main
from prioqueue.gateway.cli import GC_THRESHOLDS

seen = {}


class Node:
    pass


def probe(self, sockets=None):
    seen["thresholds"] = list(gc.get_threshold())
    seen["frozen"] = gc.get_freeze_count()
    a, b = Node(), Node()                  # a cycle made while serving
    a.other, b.other = b, a
    ref = weakref.ref(a)
    del a, b
    gc.collect()
    seen["cycle_collected"] = ref() is None
    self.started = True


uvicorn.Server.run = probe
before = list(gc.get_threshold())
status = main(["gateway", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9",
               "--log-level", "warning"])
print(json.dumps({**seen, "status": status, "expected": list(GC_THRESHOLDS), "before": before,
                  "after": list(gc.get_threshold()), "frozen_after": gc.get_freeze_count()}))
"""


def test_the_gateway_tunes_the_collector_and_cycles_are_still_collected() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == 0
    assert out["thresholds"] == out["expected"]  # set while serving
    assert out["expected"][0] > 700  # rarer than Python's default first generation
    assert out["frozen"] > 1000  # modules, configuration and app: out of the scans
    assert out["cycle_collected"]
    assert (out["after"], out["frozen_after"]) == (out["before"], 0)  # put back after
