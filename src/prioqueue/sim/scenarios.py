"""Built-in workloads, parameterised and seeded: the same seed always builds the same jobs.

* ``film-night`` (the default): one member renders a film of ``shots`` batch shots of about
  ``shot_seconds`` each, submitted all at once (``film_depth=0``) or as a ``Chain`` keeping
  ``film_depth`` shots submitted, while a crowd of ``members`` sends interactive images (tens
  of seconds) and videos (4-16 minutes) and normal-priority tool calls as random (Poisson)
  streams for ``hours``. Free, pro and max tiers; three models. The film is group ``film``.
* ``two-films``: two members' films compete at the batch level (fair share).
* ``swap-storm``: normal-priority requests for random models, with slow cold loads
  (affinity against swaps).
* ``fleet-night``: a fleet of ``gpus`` workers (4) for two films (groups ``film-ana`` and
  ``film-ben``, the second ``offset`` seconds later), a larger interactive crowd, and a long
  tail of ``tail_models`` rarely used models (Zipf popularity, ``tail_per_hour`` jobs an hour
  in all, each model loading in 45 s): the workload of warm routing.
* ``overload``: arrivals above capacity at all three levels (aging and starvation); a few jobs
  hang and need their lease to expire, a few are cancelled. The clock stops when the arrivals
  do (``horizon``): with the box overloaded for ever, what is still queued then is what a policy
  left waiting, and the report counts it.
* ``bursty``: heavy-tailed traffic on ``gpus`` workers (1): job lengths from a Pareto
  distribution (shape ``pareto_shape``) cut to ``min_seconds``-``max_seconds`` (4 s-16 min),
  ``members`` members whose demand is Zipf-skewed (exponent ``zipf``), part of the jobs
  (``burst_share``) arriving in bursts of ``burst_min``-``burst_max`` jobs from one member at
  one level, and a few jobs (``lost_fraction``) that hang and hold their GPU until their lease
  runs out. ``load`` is per worker; the clock stops at ``horizon``.

Every scenario has a ``horizon`` parameter (hours; 0 runs until every job has left).

Cold loads: the image model loads in 45 s and the LLM in 20 s, so a cold image or tool call
costs 2-3 times a warm one (the design's figure); the video model loads in 90 s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from prioqueue.errors import ConfigError
from prioqueue.priority import BATCH, INTERACTIVE, NORMAL
from prioqueue.sim._gen import _crowd, _Gen
from prioqueue.sim.workload import Arrival, Workload

__all__ = [
    "DEFAULT_SCENARIO",
    "DEFAULT_SUITE",
    "SCENARIOS",
    "UNITS",
    "Scenario",
    "build",
    "convert_param",
    "parse_params",
]

DEFAULT_SCENARIO = "film-night"
DEFAULT_SUITE = ("film-night", "two-films", "overload")
"""The scenarios a bare ``prioqueue simulate`` runs, each making one part of the case."""

UNITS: dict[str, str] = {
    "shots": "jobs",
    "shot_seconds": "s",
    "offset": "s",
    "hours": "h of arrivals",
    "members": "members",
    "images_per_hour": "jobs/h",
    "videos_per_hour": "jobs/h",
    "tools_per_hour": "jobs/h",
    "cancel_fraction": "of jobs",
    "lost_fraction": "of jobs",
    "models": "models",
    "load": "x capacity",
    "min_seconds": "s",
    "max_seconds": "s",
    "horizon": "h; 0: until every job has left",
    "film_depth": "shots submitted at once; 0: all at once",
    "gpus": "workers",
    "tail_models": "models",
    "tail_per_hour": "jobs/h",
    "zipf": "exponent of the members' demand",
    "pareto_shape": "shape of the job lengths",
    "burst_share": "of the jobs",
    "burst_min": "jobs",
    "burst_max": "jobs",
}
"""The unit of each scenario parameter, for ``--list-scenarios``."""

_LOADS = {"image": 30.0, "video": 60.0, "llm": 15.0}
_TAIL_LOAD = 45.0

Params = dict[str, Any]


@attrs.frozen
class Scenario:
    """A named workload generator.

    Attributes:
        name: The scenario's name.
        summary: One line for ``--list-scenarios``.
        defaults: Parameter name to default value (its type is the parameter's type); only the
            parameters the scenario uses.
        make: Builds the arrivals from the parameters and a seeded RNG.
    """

    name: str
    summary: str
    defaults: Mapping[str, Any]
    make: Callable[[Params, random.Random], list[Arrival]]


def _film(
    gen: _Gen, member: str, tier: str, shots: int, seconds: float, at: float, group: str
) -> list[Arrival]:
    rng = gen.rng
    return [
        attrs.evolve(
            gen.job(at, member, BATCH, tier, "video", seconds * rng.uniform(0.85, 1.15)),
            group=group,
        )
        for _ in range(shots)
    ]


def _crowd_streams(gen: _Gen, params: Params) -> list[Arrival]:
    rng = gen.rng
    crowd = _crowd(int(params["members"]))
    hours = float(params["hours"])
    jobs: list[Arrival] = []
    if not crowd:
        return jobs
    for at in gen.poisson(float(params["images_per_hour"]), hours):
        member, tier = rng.choice(crowd)
        jobs.append(gen.job(at, member, INTERACTIVE, tier, "image", rng.uniform(10.0, 60.0)))
    for at in gen.poisson(float(params["videos_per_hour"]), hours):
        member, tier = rng.choice(crowd)
        jobs.append(gen.job(at, member, INTERACTIVE, tier, "video", rng.uniform(240.0, 960.0)))
    for at in gen.poisson(float(params["tools_per_hour"]), hours):
        member, tier = rng.choice(crowd)
        jobs.append(gen.job(at, member, NORMAL, tier, "llm", rng.uniform(5.0, 30.0)))
    return jobs


def _film_night(params: Params, rng: random.Random) -> list[Arrival]:
    gen = _Gen(rng, params)
    shots, seconds = int(params["shots"]), float(params["shot_seconds"])
    jobs = _film(gen, "director", "pro", shots, seconds, 0.0, "film")
    return jobs + _crowd_streams(gen, params)


def _two_films(params: Params, rng: random.Random) -> list[Arrival]:
    gen = _Gen(rng, params)
    shots, seconds = int(params["shots"]), float(params["shot_seconds"])
    jobs = _film(gen, "ana", "pro", shots, seconds, 0.0, "film-ana")
    return jobs + _film(gen, "ben", "pro", shots, seconds, float(params["offset"]), "film-ben")


def _fleet_night(params: Params, rng: random.Random) -> list[Arrival]:
    gen = _Gen(rng, params)
    shots, seconds = int(params["shots"]), float(params["shot_seconds"])
    jobs = _film(gen, "ana", "pro", shots, seconds, 0.0, "film-ana")
    jobs += _film(gen, "ben", "max", shots, seconds, float(params["offset"]), "film-ben")
    jobs += _crowd_streams(gen, params)
    crowd = _crowd(int(params["members"]))
    tail = [f"tail-{k:02d}" for k in range(1, int(params["tail_models"]) + 1)]
    if crowd and tail:
        weights = [1.0 / (rank**1.1) for rank in range(1, len(tail) + 1)]
        for at in gen.poisson(float(params["tail_per_hour"]), float(params["hours"])):
            member, tier = rng.choice(crowd)
            model = rng.choices(tail, weights)[0]
            jobs.append(gen.job(at, member, NORMAL, tier, model, rng.uniform(20.0, 120.0)))
    return jobs


def _swap_storm(params: Params, rng: random.Random) -> list[Arrival]:
    gen = _Gen(rng, params)
    crowd = _crowd(int(params["members"]))
    models = [f"model-{k}" for k in range(1, int(params["models"]) + 1)]
    low, high = float(params["min_seconds"]), float(params["max_seconds"])
    per_hour = float(params["load"]) * 3600.0 / ((low + high) / 2.0)
    jobs = []
    for at in gen.poisson(per_hour, float(params["hours"])):
        member, tier = rng.choice(crowd)
        jobs.append(gen.job(at, member, NORMAL, tier, rng.choice(models), rng.uniform(low, high)))
    return jobs


def _overload(params: Params, rng: random.Random) -> list[Arrival]:
    gen = _Gen(rng, params)
    crowd = _crowd(int(params["members"]))
    hours = float(params["hours"])
    load = float(params["load"])
    # (level, model, shortest, longest, share of the load)
    mix = (
        (INTERACTIVE, "image", 10.0, 60.0, 0.4),
        (NORMAL, "llm", 5.0, 30.0, 0.3),
        (BATCH, "video", 120.0, 360.0, 0.3),
    )
    jobs = []
    for level, model, low, high, share in mix:
        per_hour = share * load * 3600.0 / ((low + high) / 2.0)
        for at in gen.poisson(per_hour, hours):
            member, tier = rng.choice(crowd)
            jobs.append(gen.job(at, member, level, tier, model, rng.uniform(low, high)))
    return jobs


def _pareto_mean(low: float, high: float, shape: float) -> float:
    """The mean of a Pareto(``shape``) distribution cut to ``[low, high]`` (by inversion)."""
    if high <= low:
        return low
    ratio: float = (low / high) ** shape
    if abs(shape - 1.0) < 1e-9:
        return low * math.log(high / low) / (1.0 - ratio)
    tail: float = low ** (1 - shape) - high ** (1 - shape)
    scale: float = low**shape
    return shape * scale * tail / ((shape - 1) * (1 - ratio))


def _pareto(rng: random.Random, low: float, high: float, shape: float) -> float:
    """A Pareto(``shape``) length cut to ``[low, high]`` (inverse transform of the cut CDF)."""
    if high <= low:
        return low
    ratio = (low / high) ** shape
    return float(low / (1.0 - rng.random() * (1.0 - ratio)) ** (1.0 / shape))


def _bursty(params: Params, rng: random.Random) -> list[Arrival]:
    gen = _Gen(rng, params)
    crowd = _crowd(int(params["members"]))
    if not crowd:
        return []
    weights = [1.0 / rank ** float(params["zipf"]) for rank in range(1, len(crowd) + 1)]
    low, high = float(params["min_seconds"]), float(params["max_seconds"])
    shape = max(float(params["pareto_shape"]), 1e-3)
    mean = _pareto_mean(low, high, shape)
    hours = float(params["hours"])
    per_hour = float(params["load"]) * int(params["gpus"]) * 3600.0 / mean
    share = min(float(params["burst_share"]), 1.0)
    small, big = int(params["burst_min"]), max(int(params["burst_min"]), int(params["burst_max"]))
    levels = ((INTERACTIVE, "image"), (NORMAL, "llm"), (BATCH, "video"))
    level_weights = (0.4, 0.3, 0.3)
    jobs: list[Arrival] = []

    def one(at: float, member: str, tier: str, level: int, model: str) -> None:
        jobs.append(gen.job(at, member, level, tier, model, _pareto(rng, low, high, shape)))

    for at in gen.poisson(per_hour * (1.0 - share), hours):
        member, tier = rng.choices(crowd, weights)[0]
        level, model = rng.choices(levels, level_weights)[0]
        one(at, member, tier, level, model)
    if share > 0 and small > 0:
        for at in gen.poisson(per_hour * share / ((small + big) / 2.0), hours):
            member, tier = rng.choices(crowd, weights)[0]
            level, model = rng.choices(levels, level_weights)[0]
            for k in range(rng.randint(small, big)):
                one(at + k * rng.uniform(0.0, 2.0), member, tier, level, model)
    return jobs


_CROWD_DEFAULTS: dict[str, Any] = {
    "hours": 12.0,
    "members": 12,
    "images_per_hour": 8.0,
    "videos_per_hour": 0.25,
    "tools_per_hour": 4.0,
    "cancel_fraction": 0.02,
    "lost_fraction": 0.0,
}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "film-night",
            "a 174-shot batch film against a crowd's interactive images, videos and tool calls",
            {
                "shots": 174,
                "shot_seconds": 240.0,
                **_CROWD_DEFAULTS,
                "film_depth": 0,
                "horizon": 0.0,
            },
            _film_night,
        ),
        Scenario(
            "two-films",
            "two members' batch films compete at the same level (fair share)",
            {
                "shots": 174,
                "shot_seconds": 240.0,
                "offset": 600.0,
                "cancel_fraction": 0.0,
                "lost_fraction": 0.0,
                "horizon": 0.0,
            },
            _two_films,
        ),
        Scenario(
            "swap-storm",
            "requests for random models with slow cold loads (affinity against swaps)",
            {
                "hours": 2.0,
                "members": 8,
                "models": 3,
                "load": 0.6,
                "min_seconds": 10.0,
                "max_seconds": 30.0,
                "cancel_fraction": 0.0,
                "lost_fraction": 0.0,
                "horizon": 0.0,
            },
            _swap_storm,
        ),
        Scenario(
            "overload",
            "arrivals at 110 % of capacity on all levels until the horizon (aging against "
            "starvation)",
            {
                "hours": 8.0,
                "members": 10,
                "load": 1.1,
                "cancel_fraction": 0.01,
                "lost_fraction": 0.005,
                "horizon": 8.0,
            },
            _overload,
        ),
        Scenario(
            "fleet-night",
            "4 GPUs: two films, an interactive crowd and a long tail of rarely used models "
            "(warm routing)",
            {
                "gpus": 4,
                "shots": 80,
                "shot_seconds": 240.0,
                "offset": 600.0,
                "hours": 8.0,
                "members": 40,
                "images_per_hour": 60.0,
                "videos_per_hour": 2.0,
                "tools_per_hour": 40.0,
                "tail_models": 24,
                "tail_per_hour": 12.0,
                "cancel_fraction": 0.02,
                "lost_fraction": 0.0,
                "film_depth": 0,
                "horizon": 0.0,
            },
            _fleet_night,
        ),
        Scenario(
            "bursty",
            "heavy-tailed (4 s-16 min Pareto) jobs in bursts of 10-40 from members with "
            "Zipf-skewed demand, a few hung jobs",
            {
                "gpus": 1,
                "hours": 6.0,
                "members": 12,
                "load": 0.9,
                "min_seconds": 4.0,
                "max_seconds": 960.0,
                "pareto_shape": 0.8,
                "zipf": 1.1,
                "burst_share": 0.5,
                "burst_min": 10,
                "burst_max": 40,
                "cancel_fraction": 0.01,
                "lost_fraction": 0.005,
                "horizon": 6.0,
            },
            _bursty,
        ),
    )
}


def convert_param(name: str, key: str, default: Any, value: Any) -> Any:
    """Convert a parameter value to the type of its default (int or float), >= 0.

    Args:
        name: The scenario (or converter) name, for the message.
        key: The parameter name.
        default: Its default value.
        value: The value given.

    Returns:
        The converted value.

    Raises:
        ConfigError: The value is not a number of that type, or is negative.
    """
    kind = type(default)
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    try:
        if kind is int:
            converted: Any = int(str(value), 10)
        else:
            converted = float(value)
    except (TypeError, ValueError):
        expected = "an integer" if kind is int else "a number"
        raise ConfigError(
            f"scenario {name!r}: parameter {key!r} must be {expected}, got {value!r}"
        ) from None
    if converted < 0:
        raise ConfigError(f"scenario {name!r}: parameter {key!r} must be >= 0, got {value!r}")
    return converted


def parse_params(name: str, overrides: Mapping[str, Any]) -> Params:
    """Return the scenario's parameters: its defaults with ``overrides`` applied and checked.

    Args:
        name: The scenario name.
        overrides: Parameter name to value (strings are converted to the default's type).

    Returns:
        Every parameter of the scenario.

    Raises:
        ConfigError: Unknown scenario or parameter, or a value of the wrong type or < 0.
    """
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise ConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    params = dict(scenario.defaults)
    for key, value in overrides.items():
        norm = key.strip().replace("-", "_")
        if norm not in params:
            raise ConfigError(
                f"scenario {name!r} has no parameter {key!r}; it has: {', '.join(params)}"
            )
        params[norm] = convert_param(name, norm, params[norm], value)
    if "gpus" in params and not 1 <= params["gpus"] <= 1024:
        raise ConfigError(f"scenario {name!r}: gpus must be within [1, 1024]")
    for key in ("cancel_fraction", "lost_fraction"):
        if key in params and params[key] > 1:
            raise ConfigError(f"scenario {name!r}: {key} must be within [0, 1]")
    return params


def build(name: str = DEFAULT_SCENARIO, *, seed: int = 1, **overrides: Any) -> Workload:
    """Build a built-in scenario's workload.

    Args:
        name: The scenario (see :data:`SCENARIOS`).
        seed: The RNG seed; the same seed and parameters always give the same workload.
        **overrides: Parameters to change (see each scenario's ``defaults``).

    Returns:
        The workload, sorted by arrival time.

    Raises:
        ConfigError: See :func:`parse_params`.
    """
    params = parse_params(name, overrides)
    rng = random.Random(f"{name}:{seed}")
    jobs = SCENARIOS[name].make(params, rng)
    jobs.sort(key=_arrival_time)
    horizon = float(params["horizon"]) * 3600.0
    depth = int(params.get("film_depth", 0))
    films = sorted({job.group for job in jobs if job.group is not None})
    loads = dict(_LOADS)
    if name == "fleet-night":
        tail = range(1, int(params["tail_models"]) + 1)
        loads.update({f"tail-{k:02d}": _TAIL_LOAD for k in tail})
    return Workload(
        name=name,
        arrivals=jobs,
        load_seconds=loads,
        default_load=30.0,
        params={"seed": seed, **params},
        horizon=horizon if horizon > 0 else None,
        chains=dict.fromkeys(films, depth) if depth > 0 else {},
        workers=_workers(name, params),
    )


def _workers(name: str, params: Params) -> int | None:
    """The fleet a scenario names (None: one GPU); ``bursty`` on one worker is one GPU."""
    if "gpus" not in params or (name != "fleet-night" and int(params["gpus"]) == 1):
        return None
    return int(params["gpus"])


def _arrival_time(job: Arrival) -> float:
    return job.arrival
