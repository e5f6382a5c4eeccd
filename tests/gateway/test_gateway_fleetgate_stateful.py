"""``FleetGate`` under random submits, finishes, failures, disconnects, take-outs and returns.

After every step: every waiter's job is in the fleet and every job of the fleet has a waiter;
each held job is held by one worker, within its slots, and its holder's grant names that
worker; a worker taken out stays in the fleet exactly while it still holds jobs (their
requests go on there: issue 21), and never holds more than its slots, out or back; no job
waits while a live worker has a free slot (nothing restricts them here); and every request
ends exactly once (answered, failed or left), never twice, never lost.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway._fleetgate import FleetGate, FleetTurn

WORKERS = ("w0", "w1", "w2")
MODELS = ("m0", "m1", None)


class Boom(Exception):
    """A request that failed inside its block."""


class FleetGateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        fleet = FleetDispatcher(max_attempts=1)
        self.gate = FleetGate(fleet)
        self.turns: dict[str, FleetTurn] = {}
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.exits: dict[str, asyncio.Future[BaseException | None]] = {}
        self.ended: dict[str, str] = {}
        self.count = 0
        self.slots = {name: 1 + index % 2 for index, name in enumerate(WORKERS)}
        for name in WORKERS[:2]:
            self._run(self._put_back(name))

    async def _put_back(self, name: str) -> None:
        self.gate.put_back(name, models=None, slots=self.slots[name], slow=False, resident=None)

    def _run(self, coro: Any) -> Any:
        result = self.loop.run_until_complete(coro)
        for _ in range(5):  # let woken tasks run
            self.loop.run_until_complete(asyncio.sleep(0))
        return result

    async def _request(self, turn: FleetTurn, leave: asyncio.Future[BaseException | None]) -> str:
        async with turn:
            while True:
                error = await leave
                if error is None and turn.requeued:  # its upstream was taken out: go again
                    leave = self.loop.create_future()
                    self.exits[turn.job_id] = leave
                    await turn.regrant()
                    continue
                if error is not None:
                    raise error
                return "done"

    async def _spawn(self, job_id: str, model: str | None) -> None:
        turn = self.gate.turn(job_id, member=f"u{self.count % 3}", model=model)
        self.turns[job_id] = turn
        self.exits[job_id] = self.loop.create_future()
        self.tasks[job_id] = self.loop.create_task(self._request(turn, self.exits[job_id]))

    def _held(self) -> list[str]:
        return [j for j, t in self.turns.items() if j not in self.ended and t.grant is not None]

    @rule(model=st.sampled_from(MODELS))
    def submit(self, model: str | None) -> None:
        self.count += 1
        self._run(self._spawn(f"j{self.count}", model))

    @rule(data=st.data(), fail=st.booleans())
    def finish(self, data: st.DataObject, fail: bool) -> None:
        held = [j for j in self._held() if not self.exits[j].done()]
        if held:
            job_id = data.draw(st.sampled_from(held))
            self.exits[job_id].set_result(Boom() if fail else None)
            self._run(asyncio.sleep(0))

    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        live = [j for j in self.turns if j not in self.ended]
        if live:
            self.tasks[data.draw(st.sampled_from(live))].cancel()
            self._run(asyncio.sleep(0))

    @rule(name=st.sampled_from(WORKERS), data=st.data())
    def take_out(self, name: str, data: st.DataObject) -> None:
        held = self.gate.take_out(name)  # their requests go on there: still held
        self._run(asyncio.sleep(0))
        for job_id in held:
            exit_ = self.exits[job_id]
            # Some never reached the upstream: given back, their holders go again.
            if not exit_.done() and data.draw(st.booleans(), label=f"{job_id} unreachable"):
                assert self.gate.requeue(self.turns[job_id])
                exit_.set_result(None)
        self._run(asyncio.sleep(0))

    @rule(name=st.sampled_from(WORKERS))
    def put_back(self, name: str) -> None:
        self._run(self._put_back(name))

    @invariant()
    def collect_ends(self) -> None:
        for job_id, task in self.tasks.items():
            if task.done() and job_id not in self.ended:
                outcome = "left" if task.cancelled() else repr(task.exception() or task.result())
                self.ended[job_id] = outcome

    @invariant()
    def waiters_and_jobs_agree(self) -> None:
        fleet = self.gate.dispatcher
        open_jobs = {j for j in self.turns if j not in self.ended}
        assert set(self.gate._waiters) == open_jobs
        assert len(fleet) + len(fleet.held) == len(open_jobs)
        for job_id in open_jobs:
            assert job_id in fleet

    @invariant()
    def holders_are_live_within_slots_and_named_in_grants(self) -> None:
        fleet = self.gate.dispatcher
        seen: set[str] = set()
        for worker in fleet.workers():
            # A worker out of the fleet stays only while its requests go on.
            assert worker.name in self.gate.live or worker.held
            assert len(worker.held) <= worker.slots
            for job_id in worker.held:
                assert job_id not in seen
                seen.add(job_id)
                grant = self.turns[job_id].grant
                assert grant is not None
                assert grant.worker == worker.name

    @invariant()
    def no_job_waits_beside_a_free_slot(self) -> None:
        fleet = self.gate.dispatcher
        if len(fleet):
            live = self.gate.live
            assert all(len(w.held) == w.slots for w in fleet.workers() if w.name in live)

    def teardown(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self._run(asyncio.sleep(0))
        self.loop.run_until_complete(self.gate.aclose())
        self.loop.close()


FleetGateMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50)
TestFleetGate = FleetGateMachine.TestCase
