"""Issue 21's broker security findings: ceilings, worker ids, leaks, queued bytes, hygiene."""

from __future__ import annotations

from typing import Any

from .broker_helpers import BOB, KEYS, api, run

LOW = {"Authorization": "Bearer sk-low"}


def test_a_key_ceiling_below_the_policy_minimum_is_kept() -> None:
    """Item 8: a -150 key waits behind another member's -100 batch job, whatever the order."""
    keys: dict[str, Any] = {
        **KEYS,
        "sk-low": {"role": "submitter", "member": "carol", "max_priority": -150},
    }

    async def scenario() -> None:
        async with api(policy={"minimum": -100, "maximum": 100}, keys=keys) as a:
            low = await a.submit(LOW, priority="interactive")
            batch = await a.submit(BOB, priority="batch")
            view = (await a.job(low, LOW)).json()
            assert view["priority"] == -150
            assert "priority -150" in view["explanation"]
            assert view["position"] == 2
            first = (await a.pop()).json()
            assert first["id"] == batch
            await a.finish(batch, "gpu-1", first["attempt"])
            assert (await a.pop()).json()["id"] == low

    run(scenario())
