"""Hundreds of concurrent requests: answered once each, one at a time, in policy order."""

from __future__ import annotations

import asyncio
import itertools

import httpx

from .gateway_helpers import CHAT, StackFactory, chat, queued, run, status, wait_for

MEMBERS = 10
LEVELS = (("interactive", 100), ("normal", 0), ("batch", -100))
PER_MEMBER_AND_LEVEL = 10
TIERS = ["max"] * 3 + ["pro"] * 3 + ["free"] * 4
BONUS = {"max": 2, "pro": 1, "free": 0}


def test_hundreds_of_requests_follow_the_policy(make_stack: StackFactory) -> None:
    keys = {
        f"key-{m}": {"member": f"m{m}", "tier": TIERS[m], "max_priority": 100}
        for m in range(MEMBERS)
    }
    # Affinity off and a small fixed charge per job: the order is then fully determined by
    # level, then tier, then fair share (round robin between the members of one tier).
    config = {
        "allow_anonymous": True,
        "keys": keys,
        "charge": 0.001,
        "scoring": {"max_affinity": 0},
    }
    stack = make_stack(config, load_seconds=0.001)
    plan = []
    for m, (alias, level), k in itertools.product(
        range(MEMBERS), LEVELS, range(PER_MEMBER_AND_LEVEL)
    ):
        model = "model-a" if (m + k) % 2 else "model-b"
        plan.append((f"m{m}:{level}:{k}", f"key-{m}", alias, model))
    total = len(plan)

    async def go() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=total + 20)
        async with httpx.AsyncClient(base_url=stack.url, timeout=60, limits=limits) as client:
            holder = asyncio.ensure_future(client.post(CHAT, json=chat(hold="gpu", tag="holder")))
            await wait_for(lambda: _running(client))
            tasks = [
                asyncio.ensure_future(
                    client.post(
                        CHAT,
                        json=chat(model, tag=tag),
                        headers={"Authorization": f"Bearer {key}", "X-LlamaSwap-Priority": alias},
                    )
                )
                for tag, key, alias, model in plan
            ]
            await wait_for(lambda: _queued_is(client, total), timeout=30)
            snapshot = await status(client)
            assert sum(level["queued"] for level in snapshot["levels"].values()) == total
            stack.fake.release("gpu")
            responses = await asyncio.gather(holder, *tasks)
            return list(responses)

    responses = run(go(), timeout=90)
    assert [r.status_code for r in responses] == [200] * (total + 1)
    jobs = {r.headers["x-prioqueue-job"] for r in responses}
    assert len(jobs) == total + 1  # each answered once, with its own job
    order = stack.fake.order()
    assert order[0] == "holder"
    served = [str(tag) for tag in order[1:]]
    assert sorted(served) == sorted(tag for tag, *_ in plan)  # each served exactly once
    assert stack.fake.max_active == 1  # never two at once

    def key(tag: str) -> tuple[int, int]:
        member, level, _ = tag.split(":")
        return int(level), BONUS[TIERS[int(member[1:])]]

    # strict priority, then tier, in the upstream's order
    keys_in_order = [key(tag) for tag in served]
    assert keys_in_order == sorted(keys_in_order, reverse=True)
    # fair share inside each (level, tier) group: in every prefix, members' counts differ by
    # at most one (each member has the same number of jobs in the group)
    for group in set(keys_in_order):
        counts = {t.split(":")[0]: 0 for t in served if key(t) == group}
        for tag in served:
            if key(tag) == group:
                counts[tag.split(":")[0]] += 1
                assert max(counts.values()) - min(counts.values()) <= 1, (group, counts)


async def _running(client: httpx.AsyncClient) -> bool:
    return (await status(client))["running"] is not None


async def _queued_is(client: httpx.AsyncClient, n: int) -> bool:
    return await queued(client) == n
