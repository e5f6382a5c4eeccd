"""The cost of the per-job policy calls: ``Scorer.score()`` and ``parse_priority()``.

Run as ``python benchmarks/bench_policy.py``. Each figure is printed beside a baseline measured
in the same run: the bare arithmetic for the score, ``int("100")`` for the parser. Hostile
headers must cost about as much as valid ones (the length is checked before any work).
"""

from __future__ import annotations

from functools import partial

from _harness import per_call, report, section

from prioqueue.priority import parse_priority
from prioqueue.scoring import Scorer


def bench_score() -> None:
    section("Scorer.score() against the bare arithmetic")
    scorer = Scorer()
    band, tier, aff, wait, divisor = 0, 2.0, 10.0, 30.0, 60.0
    bare = per_call(lambda: band + tier + aff + wait / divisor)
    scored = per_call(lambda: scorer.score(band, tier, aff, wait))
    report("Scorer.score(0, 2.0, 10.0, 30.0)", scored, "band+tier+aff+wait/div", bare)
    broken_down = per_call(lambda: scorer.breakdown(band, tier, aff, wait))
    report("Scorer.breakdown(0, 2.0, 10.0, 30.0)", broken_down, "band+tier+aff+wait/div", bare)


def bench_parse() -> None:
    section("parse_priority() against int('100')")
    baseline = per_call(lambda: int("100"))
    cases: list[tuple[str, str]] = [
        ("valid '100'", "100"),
        ("valid '-100'", "-100"),
        ("valid 'interactive'", "interactive"),
        ("hostile: 10,000 digits", "9" * 10_000),
        ("hostile: 31 digits", "9" * 31),
        ("hostile: Unicode digits", "\u0661\u0662\u0663"),
        ("hostile: '1e9999'", "1e9999"),
        ("hostile: '1,2,3'", "1,2,3"),
    ]
    for name, value in cases:
        seconds = per_call(partial(parse_priority, value))
        report(f"parse_priority {name}", seconds, "int('100')", baseline)
    # For scale: what an unbounded parser would pay. int() refuses the 10,000 digits outright
    # (ValueError past sys.get_int_max_str_digits(), 4,300 by default), so time the largest
    # string it accepts.
    limit = "9" * 4_300
    naive = per_call(lambda: int(limit), repeat=3)
    report("(for scale) int() on 4,300 digits", naive, "int('100')", baseline)


def main() -> None:
    bench_score()
    bench_parse()


if __name__ == "__main__":
    main()
