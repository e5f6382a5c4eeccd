"""What the two HTTP services (``prioqueue.gateway``, ``prioqueue.broker``) share (private).

* :mod:`~prioqueue._service.config`: reading a service's TOML (typed getters naming the key
  by its TOML path, the ``[policy]``, ``[tiers]``, ``[scoring]`` tables, ``listen``,
  ``charge``, API key tables).
* :mod:`~prioqueue._service.lifecycle`: the ``[budgets.<level>]`` and ``[backoff]`` tables.
* :mod:`~prioqueue._service.cli`: the command line both ``prioqueue gateway`` and
  ``prioqueue broker`` have (log options, the extras check, the start's one-line errors,
  "listening", signal handling).
* :mod:`~prioqueue._service.serving`: connection hygiene under uvicorn (the settings both
  configurations hold, :class:`~prioqueue._service.serving.ConnectionLimits`,
  ``uvicorn_config``); :mod:`~prioqueue._service.protocol` is the hardened protocol itself,
  imported when a server starts.
* :mod:`~prioqueue._service.server`: binding the listening socket before "listening" is said.

Only the standard library and prioqueue's core are imported at module level (uvicorn is
imported by the functions that need it), so either service's configuration can be read and
checked without the other's extras. Nothing here is public API: the services import it.
"""

from __future__ import annotations

__all__: list[str] = []
