"""Convert an Azure LLM inference trace (2023) into a prioqueue trace (JSON Lines).

Usage, with the conversation trace of the Azure Public Dataset
(``AzureLLMInferenceTrace_conv.csv``, downloaded by you from the dataset's page)::

    python examples/azure_trace.py AzureLLMInferenceTrace_conv.csv conv.jsonl --seed 1
    prioqueue simulate --trace conv.jsonl

(or replay the CSV directly: ``prioqueue simulate --trace FILE.csv``, which recognises it).
The mapping is reproducible from the seed, and the JSON Lines file carries the cold-load times
in its header, so replaying it gives exactly the numbers of replaying the CSV with the same
seed and parameters; see ``docs/simulator.md``. The Azure files are read
from the path given and never copied into this repository. Anything shared from the output
must carry the attribution printed below (CC BY 4.0).
"""

from __future__ import annotations

import argparse
import sys

from prioqueue.sim.traces import AZURE_ATTRIBUTION, AZURE_DEFAULTS, convert_azure, write_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="AzureLLMInferenceTrace_{code,conv}.csv")
    parser.add_argument("target", help="the JSON Lines trace to write ('-': stdout)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"converter parameter; defaults: {AZURE_DEFAULTS}",
    )
    args = parser.parse_args(argv)
    bad = [item for item in args.param if "=" not in item]
    if bad:
        parser.error(f"--param takes KEY=VALUE, got {bad[0]!r}")
    params = dict(item.split("=", 1) for item in args.param)
    try:
        workload = convert_azure(args.source, seed=args.seed, params=params)
        if args.target == "-":
            rows = write_trace(workload, sys.stdout)
        else:
            with open(args.target, "w", encoding="utf-8") as handle:
                rows = write_trace(workload, handle)
    except OSError as exc:  # a missing or unreadable file: one line, not a traceback
        parser.exit(1, f"{parser.prog}: {exc.filename or args.source}: {exc.strerror}\n")
    except ValueError as exc:  # not an Azure trace, or a bad parameter value
        parser.exit(1, f"{parser.prog}: {exc}\n")
    print(f"{rows} jobs, time scale {workload.params['time_scale']:.3f}", file=sys.stderr)
    print(f"trace data: {AZURE_ATTRIBUTION}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
