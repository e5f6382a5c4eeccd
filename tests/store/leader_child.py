"""A broker stand-in for the failover tests: elect, then submit a job every 50 ms.

Usage: ``python leader_child.py URL SCHEMA NAME LEASE``. Prints ``LEADER <epoch>`` when it
leads, ``ACK <job id>`` after each acknowledged submit, and ``FENCED`` (exit 3) when an append
is refused because another broker took over, or ``FATAL`` (exit 4) when its append failed
otherwise (the server ended its session while it was stopped mid-transaction). A ``LEASE`` of
0 means the default timings.
"""

from __future__ import annotations

import asyncio
import sys

from prioqueue import SizeOneDispatcher
from prioqueue.store import (
    DurableDispatcher,
    Elector,
    Fenced,
    PostgresStore,
    StoreFatal,
    dispatcher_factory,
    open_store,
)


def say(line: str) -> None:
    print(line, flush=True)


async def main(url: str, schema: str, name: str, lease: float) -> int:
    address = f"http://{name}"
    if lease == 0:
        elector = Elector(url, schema=schema, name=name, address=address)
    else:
        elector = Elector(
            url, schema=schema, name=name, address=address, lease=lease, renew_interval=lease / 4
        )
    await elector.start()
    epoch = await elector.wait_leader()
    say(f"LEADER {epoch}")
    store = (
        open_store(url, schema=schema)
        if lease == 0
        else PostgresStore(url, schema=schema, idle_timeout=lease / 2)
    )
    durable = await DurableDispatcher.open(
        store, dispatcher_factory(SizeOneDispatcher), epoch=epoch
    )
    i = 0
    try:
        while True:
            job_id = f"{name}-{i}"
            await durable.call("submit", job_id=job_id, member=name)
            say(f"ACK {job_id}")
            i += 1
            await asyncio.sleep(0.05)
    except Fenced:
        say("FENCED")
        return 3
    except StoreFatal as exc:
        say(f"FATAL {exc}")
        return 4


if __name__ == "__main__":
    url, schema, name, lease = sys.argv[1:5]
    sys.exit(asyncio.run(main(url, schema, name, float(lease))))
