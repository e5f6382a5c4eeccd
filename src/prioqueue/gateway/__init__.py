"""The HTTP gateway: a priority-gated reverse proxy in front of llama-swap.

Clients talk to the gateway as if it were llama-swap. Requests that use the GPU (OpenAI-style
inference calls) wait for their turn in a :class:`~prioqueue.dispatcher.SizeOneDispatcher`;
everything else passes straight through. Run it with ``prioqueue gateway --config FILE``
(``pip install 'prioqueue-lanes[gateway]'``); see ``docs/gateway.md``.

Only the standard library and prioqueue's core are imported here; aiohttp and uvicorn are
imported when the gateway starts.
"""

from __future__ import annotations

from prioqueue.gateway.app import Gateway
from prioqueue.gateway.config import GatewayConfig, load_config, parse_config

__all__ = ["Gateway", "GatewayConfig", "load_config", "parse_config"]
