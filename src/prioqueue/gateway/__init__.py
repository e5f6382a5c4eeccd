"""The HTTP gateway: a priority-gated reverse proxy in front of llama-swap.

Clients talk to the gateway as if it were llama-swap. Requests that can run or load a model
(every POST, anything under ``/upstream/``, and llama-swap's model GET routes) wait for their
turn in a :class:`~prioqueue.dispatcher.SizeOneDispatcher`; everything else passes straight
through. Run it with ``prioqueue gateway --config FILE`` (from a clone:
``pip install '.[gateway,prometheus]'``); see ``docs/gateway.md``.

Only the standard library and prioqueue's core are imported here; aiohttp and uvicorn are
imported when the gateway starts.
"""

from __future__ import annotations

from prioqueue.gateway.app import Gateway, Identity
from prioqueue.gateway.config import GatewayConfig, load_config, parse_config
from prioqueue.gateway.settings import ApiKey, Limits

__all__ = [
    "ApiKey",
    "Gateway",
    "GatewayConfig",
    "Identity",
    "Limits",
    "load_config",
    "parse_config",
]
