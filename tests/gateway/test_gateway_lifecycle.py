"""The gateway's overload protection: ``[budgets.<level>]`` max_queued (429), max_wait (503
from the forecast) and ttl (an expired queued request is a 503), and their validation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import httpx
import pytest

from prioqueue import ConfigError, LevelBudget
from prioqueue.asyncio import AsyncDispatcher, QueueTimeout
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway import parse_config
from prioqueue.gateway._fleetgate import FleetGate

from .gateway_helpers import CHAT, Stack, StackFactory, chat, queued, run, status, wait_for


async def _hold(client: httpx.AsyncClient) -> asyncio.Task[httpx.Response]:
    task = asyncio.ensure_future(client.post(CHAT, json=chat(hold="gpu", tag="holder")))

    async def running() -> bool:
        return (await status(client))["running"] is not None

    await wait_for(running)
    return task


async def _eq(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def _refused_behind_one(stack: Stack, tag: str) -> httpx.Response:
    """Hold the GPU, queue one request, send one more (``tag``); answer of the last one.

    The GPU is released before returning; the holder and the queued request both succeed.
    """

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = await _hold(client)
            waiting = asyncio.ensure_future(client.post(CHAT, json=chat(tag="waiting")))
            await wait_for(lambda: _eq(queued(client), 1))
            refused = await client.post(CHAT, json=chat(tag=tag))
            stack.fake.release("gpu")
            assert (await holder).status_code == 200
            assert (await waiting).status_code == 200
            return refused

    response: httpx.Response = run(go())
    assert tag not in stack.fake.order()
    return response


def test_a_level_over_its_max_queued_is_429_with_retry_after(make_stack: StackFactory) -> None:
    stack = make_stack({"budgets": {"normal": {"max_queued": 1}}})
    full = _refused_behind_one(stack, "two")
    assert full.status_code == 429
    assert int(full.headers["retry-after"]) >= 1
    assert "max_queued=1" in full.json()["error"]["message"]


def test_a_forecast_wait_over_max_wait_is_503_with_retry_after(make_stack: StackFactory) -> None:
    stack = make_stack({"budgets": {"normal": {"max_wait": 20}}})
    # One request of 60 s (nothing measured yet) is ahead: forecast 60 s > 20 s.
    refused = _refused_behind_one(stack, "refused")
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "40"  # ceil(60 - 20)
    assert refused.json()["error"]["type"] == "overloaded"
    assert "max_wait=20" in refused.json()["error"]["message"]


def test_a_queued_request_past_its_ttl_expires_with_503(make_stack: StackFactory) -> None:
    stack = make_stack({"budgets": {"normal": {"ttl": 0.2}}})

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = await _hold(client)
            late = await client.post(CHAT, json=chat(tag="late"))
            assert late.status_code == 503
            assert "expired" in late.json()["error"]["message"]
            job = (await client.get("/prioqueue/jobs/" + late.headers["x-prioqueue-job"])).json()
            assert job["outcome"] == "timed out in the queue"
            assert stack.gateway.dispatcher.stats(now=stack.gateway.gate.now()).ttl_expired == 1
            stack.fake.release("gpu")
            assert (await holder).status_code == 200

    run(go())
    assert "late" not in stack.fake.order()


def test_the_fleet_gate_fails_a_waiter_whose_ttl_ran_out() -> None:
    async def main() -> None:
        fleet = FleetDispatcher(max_attempts=1, budgets={0: LevelBudget(ttl=0.05)})
        gate = FleetGate(fleet)
        gate.put_back("a", models=None, slots=1, slow=False, resident=None)
        async with gate.turn("holder", member="m"):
            with pytest.raises(QueueTimeout, match="expired"):
                async with gate.turn("late", member="m"):
                    pass
        assert "late" not in fleet
        assert fleet.stats(now=gate.now()).ttl_expired == 1

    run(main())


def test_the_size_one_adapter_fails_a_waiter_whose_ttl_ran_out() -> None:
    async def main() -> None:
        d = SizeOneDispatcher(budgets={0: LevelBudget(ttl=0.05)})
        gate = AsyncDispatcher(d)
        async with gate.turn("holder", member="m"):
            with pytest.raises(QueueTimeout, match="expired"):
                async with gate.turn("late", member="m"):
                    pass
        assert "late" not in d

    run(main())


@pytest.mark.parametrize(
    ("budgets", "message"),
    [
        ({"urgent": {"ttl": 5}}, "budgets.urgent: not a priority level"),
        ({"interactive": {"max_wait": 0}}, "budgets.interactive.max_wait: must be > 0"),
        ({"normal": {"max_queued": 0}}, "budgets.normal.max_queued: must be >= 1"),
        ({"normal": {"ttl": -1}}, "budgets.normal.ttl: must be > 0"),
        ({"normal": {"deadline": 1}}, "budgets.normal.deadline: unknown key"),
    ],
)
def test_budgets_in_the_toml_are_validated_naming_the_key(
    budgets: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config({"budgets": budgets})


def test_budgets_reach_the_dispatcher() -> None:
    config = parse_config({"budgets": {"interactive": {"max_queued": 3, "ttl": 60, "max_wait": 9}}})
    assert config.budgets == {100: LevelBudget(max_queued=3, max_wait=9.0, ttl=60.0)}
