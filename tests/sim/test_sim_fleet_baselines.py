"""The fleet pull baselines against a brute-force model: same grant for every pop."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prioqueue.sim.fleet_policies import build_pull_baseline
from prioqueue.sim.workers import WorkerSpec

WORKERS = (
    WorkerSpec("any", None, 2),
    WorkerSpec("ab", frozenset({"a", "b"}), 1, 1.0, "a"),
    WorkerSpec("c", frozenset({"c"}), 1),
)
NAMES = [w.name for w in WORKERS]


class Reference:
    """Scans every queued job on each pop; keys as the docs of fleet_policies say."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.queued: list[dict[str, Any]] = []
        self.held: dict[str, dict[str, Any]] = {}
        self.resident: dict[str, str | None] = {w.name: w.resident for w in WORKERS}
        self.requeues = 0

    def key(self, job: dict[str, Any]) -> tuple[int, int]:
        if self.kind == "strict":
            return (-job["priority"], job["seq"])
        return (0, -job["requeued"]) if job["requeued"] else (1, job["seq"])

    def pop(self, name: str, now: float, lease: float) -> str | None:
        spec = next(w for w in WORKERS if w.name == name)
        if sum(1 for j in self.held.values() if j["worker"] == name) >= spec.slots:
            return None
        ok = [
            j
            for j in self.queued
            if spec.models is None or j["model"] is None or j["model"] in spec.models
        ]
        warm = [j for j in ok if j["model"] == self.resident[name]]
        if self.kind == "warm-first" and self.resident[name] is not None and warm:
            ok = warm
        if not ok:
            return None
        job = min(ok, key=self.key)
        self.queued.remove(job)
        job["attempt"] += 1
        job["worker"] = name
        job["deadline"] = now + lease
        self.held[job["id"]] = job
        if job["model"] is not None:
            self.resident[name] = job["model"]
        return str(job["id"])

    def expire(self, now: float) -> list[tuple[str, bool]]:
        due = sorted(
            (j for j in self.held.values() if j["deadline"] <= now),
            key=lambda j: (j["deadline"], j["seq"]),
        )
        out = []
        for job in due:
            del self.held[job["id"]]
            if job["attempt"] >= 3:
                out.append((job["id"], False))
            else:
                self.requeues += 1
                job["requeued"] = self.requeues
                self.queued.append(job)
                out.append((job["id"], True))
        return out


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.sampled_from((-100, 0, 100)),
            st.sampled_from(("a", "b", "c", None)),
        ),
        st.tuples(st.just("pop"), st.sampled_from(NAMES), st.sampled_from((5.0, 50.0))),
        st.tuples(st.just("complete"), st.integers(0, 30)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("tick"), st.sampled_from((1.0, 20.0, 60.0))),
    ),
    max_size=60,
)


@settings(max_examples=150)
@given(kind=st.sampled_from(("fifo", "strict", "warm-first")), script=ops)
def test_pull_baselines_match_the_brute_force_model(kind: str, script: list[Any]) -> None:
    leases: dict[str, float] = {}
    queue = build_pull_baseline(kind, WORKERS, lambda job, _name: leases[job.id])
    model = Reference(kind)
    now = 0.0
    seq = 0
    for op in script:
        if op[0] == "submit":
            job_id = str(seq)
            queue.submit(job_id, member="m", priority=op[1], model=op[2], now=now)
            model.queued.append(
                {
                    "id": job_id,
                    "priority": op[1],
                    "model": op[2],
                    "seq": seq,
                    "attempt": 0,
                    "requeued": 0,
                }
            )
            seq += 1
        elif op[0] == "pop":
            for job in model.queued:
                leases[job["id"]] = op[2]
            grant = queue.pop(op[1], now=now)
            want = model.pop(op[1], now, op[2])
            assert (None if grant is None else grant.job.id) == want
        elif op[0] in ("complete", "cancel"):
            job_id = str(op[1])
            held = model.held.get(job_id)
            if op[0] == "complete" and held is not None:
                queue.complete(job_id, now=now, worker=held["worker"])
                del model.held[job_id]
            elif op[0] == "cancel" and (held or any(j["id"] == job_id for j in model.queued)):
                queue.cancel(job_id, now=now)
                model.held.pop(job_id, None)
                model.queued = [j for j in model.queued if j["id"] != job_id]
        else:
            now += op[1]
            got = [(e.job.id, e.requeued) for e in queue.expire(now)]
            assert got == model.expire(now)
        assert len(queue) == len(model.queued)
        deadlines = [j["deadline"] for j in model.held.values()]
        assert queue.next_deadline() == (min(deadlines) if deadlines else None)
        for name in NAMES:
            assert queue.resident(name) == model.resident[name]
