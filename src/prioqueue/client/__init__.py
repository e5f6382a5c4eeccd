"""``prioqueue.client``: the broker's Python clients (the ``client`` extra: httpx, stamina).

* :class:`Broker` (blocking) and :class:`AsyncBroker` for submitters: ``submit``,
  ``submit_many``, ``get``, ``wait``, ``cancel``, ``group``, ``cancel_group``, ``status``.
* :class:`Worker` for GPU hosts: ``for job in worker.jobs(): ... job.complete(result)`` or
  ``worker.run(handler)``, with long-poll pops, background heartbeats and a clean stop.

Every call retries transport errors, 503 and 429 with exponential backoff and jitter
(``stamina``), follows the leader a standby names (``X-Prioqueue-Leader``), and raises
:class:`BrokerError` for a refusal. Workers in five lines::

    from prioqueue.client import Worker

    def render(job):
        return {"frames": len(job.payload["shots"])}

    Worker("http://127.0.0.1:8091", "wk-fleet", "gpu-a").run(render)
"""

from __future__ import annotations

from prioqueue.client import errors
from prioqueue.client.broker import AsyncBroker, Broker
from prioqueue.client.errors import *  # noqa: F403 (its __all__, added to ours below)
from prioqueue.client.worker import Job, Worker

__all__ = ["AsyncBroker", "Broker", "Job", "Worker"]
__all__ += errors.__all__  # the client's exceptions, one per outcome a caller handles
