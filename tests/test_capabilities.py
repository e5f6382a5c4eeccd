"""Worker capabilities and job needs (docs/design/capabilities.md): the rule and the fleet."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prioqueue.capabilities import (
    CAPABILITY_CAUSES,
    FEATURES,
    Capabilities,
    Needs,
    chosen_model,
    unfit,
)
from prioqueue.fleet import FleetDispatcher
from prioqueue.records import Job
from prioqueue.testing import ReferenceFleet

SDXL_ONLY = Capabilities(max_pixels=1024 * 1024, features={"img2img"})


def test_the_causes_come_in_the_documented_order() -> None:
    assert CAPABILITY_CAUSES[0] == "model"
    assert set(FEATURES) < set(CAPABILITY_CAUSES)
    big = Needs(pixels=2048 * 2048, steps=200, features={"lora"}, nsfw=True, text="Castle")
    caps = Capabilities(max_pixels=512 * 512, features=(), nsfw=False, max_steps=30)
    assert unfit(None, caps, big) == "max_pixels"
    assert unfit(None, Capabilities(max_steps=30, features=()), big) == "max_steps"
    assert unfit(None, Capabilities(features=()), big) == "lora"
    assert unfit(None, Capabilities(nsfw=False), big) == "nsfw"
    assert unfit(None, Capabilities(blacklist=["CASTLE"]), big) == "blacklist"
    assert unfit(None, Capabilities(), big) is None
    assert unfit(None, None, big) is None
    assert unfit(frozenset({"a"}), None, Needs(models=["b", "c"])) == "model"
    assert unfit(frozenset({"c"}), None, Needs(models=["b", "c"])) is None


def test_chosen_model_prefers_the_resident_then_the_first_served() -> None:
    assert chosen_model(("sdxl", "flux_1"), None, "flux_1") == "flux_1"
    assert chosen_model(("sdxl", "flux_1"), None, "other") == "sdxl"
    assert chosen_model(("sdxl", "flux_1"), frozenset({"flux_1"}), None) == "flux_1"
    assert chosen_model(("sdxl", "flux_1"), frozenset({"sdxl"}), "flux_1") == "sdxl"
    with pytest.raises(ValueError, match="no model"):
        chosen_model(("sdxl",), frozenset({"x"}), None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_pixels": 0}, "max_pixels must be an int >= 1"),
        ({"features": ["wings"]}, "unknown feature"),
        ({"features": "lora"}, "collection of feature names"),
        ({"nsfw": 1}, "nsfw must be a bool"),
        ({"blacklist": [""]}, "non-empty strs"),
        ({"max_steps": True}, "max_steps must be an int"),
    ],
)
def test_bad_capabilities_say_what_is_allowed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Capabilities(**kwargs)


def test_bad_needs_and_mappings_are_refused() -> None:
    with pytest.raises(ValueError, match="pixels must be an int >= 0"):
        Needs(pixels=-1)
    with pytest.raises(ValueError, match="unknown key"):
        Needs.from_mapping({"colour": "red"})
    with pytest.raises(ValueError, match="must be a mapping"):
        Capabilities.from_mapping([])  # type: ignore[arg-type]
    fleet = FleetDispatcher()
    with pytest.raises(ValueError, match="disagrees with model"):
        fleet.submit("j", member="m", model="a", needs={"models": ["b"]}, now=0.0)
    with pytest.raises(ValueError, match="needs must be a Needs"):
        fleet.submit("j", member="m", needs=3, now=0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capabilities must be"):
        fleet.join("w", capabilities=3, now=0.0)  # type: ignore[arg-type]


def test_json_forms_round_trip() -> None:
    caps = Capabilities(max_pixels=10, features={"lora", "img2img"}, blacklist=["B", "a"])
    assert Capabilities.from_mapping(json.loads(json.dumps(caps.as_dict()))) == caps
    assert caps.blacklist == ("a", "b")
    needs = Needs(models=["x", "y", "x"], pixels=4, features={"lora"}, text="t")
    assert needs.models == ("x", "y")
    assert Needs.from_mapping(json.loads(json.dumps(needs.as_dict()))) == needs


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet])
def test_a_worker_never_gets_what_it_cannot_run_and_says_why(make: Any) -> None:
    fleet = make()
    fleet.join("small", capabilities=SDXL_ONLY, now=0.0)
    fleet.submit("big", member="a", needs=Needs(pixels=2048 * 2048), now=1.0)
    fleet.submit("lora", member="b", needs=Needs(pixels=512 * 512, features={"lora"}), now=2.0)
    assert fleet.pop("small", now=3.0) is None
    assert dict(fleet.idle_reasons("small", now=3.0)) == {"max_pixels": 1, "lora": 1}
    fleet.join("large", now=3.0)
    grant = fleet.pop("large", now=4.0)
    assert grant is not None
    assert grant.job.id == "big"


def test_explain_names_the_workers_that_skip_a_job() -> None:
    fleet = FleetDispatcher()
    fleet.join("small", capabilities=SDXL_ONLY, now=0.0)
    fleet.join("other", models=["flux_1"], now=0.0)
    fleet.join("any", now=0.0)
    fleet.submit("big", member="a", model="sdxl", needs=Needs(pixels=2048 * 2048), now=1.0)
    explained = fleet.explain("big", now=1.0)
    assert dict(explained.unfit) == {"small": "max_pixels", "other": "model"}
    assert "does not fit: other (model), small (max_pixels)" in str(explained)


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet])
@pytest.mark.parametrize("resident", ["sdxl", "flux_1"])
def test_a_multi_model_job_runs_on_the_worker_with_either_resident(
    make: Any, resident: str
) -> None:
    seen: list[str | None] = []

    def lease_for(job: Job) -> float:
        seen.append(job.model)
        return 300.0 if job.model == "flux_1" else 100.0  # the slow model's factor

    fleet = make(lease_for=lease_for)
    fleet.join("cold", models=["anything"], resident="anything", now=0.0)
    fleet.join("warm", models=["sdxl", "flux_1"], resident=resident, now=0.0)
    fleet.submit("j", member="a", needs=Needs(models=["sdxl", "flux_1"]), now=1.0)
    assert fleet.pop("cold", now=2.0) is None
    assert dict(fleet.idle_reasons("cold", now=2.0)) == {"model": 1}
    grant = fleet.pop("warm", now=2.0)
    assert grant is not None
    assert grant.job.model == resident
    assert not grant.swap
    assert grant.lease is not None
    assert grant.lease.seconds == (300.0 if resident == "flux_1" else 100.0)
    assert seen == [resident]
    assert fleet.worker("warm").resident == resident


def test_a_multi_model_grant_survives_a_snapshot_and_its_requeue_keeps_every_model() -> None:
    fleet = FleetDispatcher(lease_for=lambda job: 100.0)
    fleet.join("w", models=["flux_1"], capabilities=Capabilities(features={"lora"}), now=0.0)
    needs = Needs(models=["sdxl", "flux_1"], features={"lora"}, pixels=64)
    fleet.submit("j", member="a", needs=needs, now=1.0)
    grant = fleet.pop("w", now=2.0)
    assert grant is not None
    assert grant.job.model == "flux_1"
    state = json.loads(json.dumps(fleet.snapshot(now=3.0)))
    back = FleetDispatcher.restore(state, lease_for=lambda job: 100.0)
    assert back.held[0].job.model == "flux_1"
    assert back.worker("w").capabilities == Capabilities(features={"lora"})
    (requeued,) = back.leave("w", now=4.0)
    assert requeued.model is None
    assert requeued.needs == needs
    assert back.snapshot(now=4.0)["queued"][0]["needs"] == needs.as_dict()


def test_a_restored_grant_must_name_a_model_its_job_accepts() -> None:
    fleet = FleetDispatcher(lease_for=lambda job: 100.0)
    fleet.join("w", now=0.0)
    fleet.submit("j", member="a", needs=Needs(models=["sdxl", "flux_1"]), now=1.0)
    fleet.pop("w", now=2.0)
    state = fleet.snapshot(now=3.0)
    state["held"][0]["granted_model"] = "other"
    with pytest.raises(ValueError, match="not one it accepts"):
        FleetDispatcher.restore(state, lease_for=lambda job: 100.0)


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet])
def test_pop_many_grants_several_jobs_in_one_pop(make: Any) -> None:
    fleet = make()
    fleet.join("w", slots=3, now=0.0)
    for i in range(4):
        fleet.submit(f"j{i}", member="a" if i % 2 else "b", now=float(i))
    grants = fleet.pop_many("w", amount=5, now=5.0)
    assert [g.job.id for g in grants] == ["j0", "j1", "j2"]  # stopped at its 3 slots
    assert fleet.pop_many("w", amount=2, now=6.0) == []
    with pytest.raises(ValueError, match=r"amount must be an int in 1\.\.100"):
        fleet.pop_many("w", amount=0, now=6.0)


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet])
def test_pop_many_siblings_takes_the_first_jobs_group_only(make: Any) -> None:
    fleet = make()
    fleet.join("w", slots=6, now=0.0, accepts=lambda job: job.id != "r2")
    fleet.submit("o1", member="bob", now=0.0)  # no group: granted alone
    for i in range(4):
        fleet.submit(f"r{i}", member="alice", now=0.1, group="req")
    fleet.submit("o2", member="bob", now=0.2, group="other")
    first = fleet.pop_many("w", amount=3, now=1.0, siblings=True)
    assert [g.job.id for g in first] == ["o1"]
    batch = fleet.pop_many("w", amount=3, now=1.0, siblings=True)
    assert [g.job.id for g in batch] == ["r0", "r1", "r3"]  # accepts still applies
    assert fleet.pop_many("w", amount=3, now=1.0, siblings=True)[0].job.id == "o2"
    assert fleet.idle_reasons("w", now=1.0) == {"accepts": 1}  # the filter was put back
    with pytest.raises(TypeError, match="siblings must be a bool"):
        fleet.pop_many("w", amount=3, now=1.0, siblings=1)


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet])
def test_a_multi_model_job_gets_the_affinity_of_a_resident_model_it_accepts(make: Any) -> None:
    fleet = make()
    fleet.join("warm", now=0.0, resident="flux_1")
    fleet.join("cold", now=0.0)
    fleet.submit("plain", member="bob", model="sdxl", now=0.0)
    fleet.submit("either", member="alice", needs=Needs(models=["sdxl", "flux_1"]), now=1.0)
    fleet.submit("other", member="carol", needs=Needs(models=["sdxl", "qwen"]), now=1.5)
    grant = fleet.pop("warm", now=2.0)
    assert (grant.job.id, grant.job.model, grant.swap) == ("either", "flux_1", False)
    assert grant.score.swap_affinity == 10.0  # the bonus of flux_1, resident here
    assert fleet.stats(now=2.0).levels[0].reorders.affinity == 1  # it beat the older job
    cold = fleet.pop("cold", now=2.0)
    assert (cold.job.id, cold.score.swap_affinity) == ("plain", 0.0)  # nothing resident


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet])
def test_no_bonus_for_a_resident_the_worker_does_not_serve(make: Any) -> None:
    """Found by the long hunt: the job would run on the served model, a swap."""
    fleet = make()
    fleet.join("w", now=0.0, models=["m1"], resident="m2")
    fleet.submit("j", member="ann", needs=Needs(models=["m1", "m2"]), now=0.0)
    grant = fleet.pop("w", now=0.0)
    assert (grant.job.model, grant.swap, grant.score.swap_affinity) == ("m1", True, 0.0)


def test_an_error_after_the_first_grant_ends_the_batch() -> None:
    def lease_for(job: Job) -> float:
        if job.id == "bad":
            raise RuntimeError("no lease")
        return 10.0

    fleet = FleetDispatcher(lease_for=lease_for)
    fleet.join("w", slots=3, now=0.0)
    fleet.submit("good", member="a", now=0.0)
    fleet.submit("bad", member="b", now=1.0)
    assert [g.job.id for g in fleet.pop_many("w", amount=3, now=2.0)] == ["good"]
    assert "bad" in fleet
    with pytest.raises(Exception, match="no lease"):
        fleet.pop_many("w", amount=3, now=3.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"models": "sdxl"}, "list of model names"),
        ({"models": [""]}, "non-empty strs"),
        ({"text": 3}, "text must be a str"),
        ({"nsfw": "yes"}, "nsfw must be a bool"),
    ],
)
def test_bad_needs_say_what_is_allowed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Needs(**kwargs)


def test_a_blacklist_must_be_a_collection_and_a_fleet_takes_mappings() -> None:
    with pytest.raises(ValueError, match="collection of words"):
        Capabilities(blacklist="castle")
    fleet = FleetDispatcher()
    info = fleet.join("w", capabilities={"max_pixels": 64, "features": []}, now=0.0)
    assert info.capabilities == Capabilities(max_pixels=64, features=())
    ticket = fleet.submit("j", member="m", needs={"pixels": 65}, now=0.0)
    assert ticket.job.needs == Needs(pixels=65)
    assert fleet.pop("w", now=1.0) is None


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet])
def test_a_declared_only_worker_never_gets_a_job_without_needs(make: Any) -> None:
    fleet = make()
    fleet.join("horde", slots=2, capabilities=Capabilities(declared_only=True), now=0.0)
    fleet.submit("plain", member="a", now=1.0)
    fleet.submit("declared", member="b", needs=Needs(pixels=64), now=2.0)
    grant = fleet.pop("horde", now=3.0)
    assert grant is not None
    assert grant.job.id == "declared"
    assert fleet.pop("horde", now=3.0) is None
    assert dict(fleet.idle_reasons("horde", now=3.0)) == {"undeclared": 1}


def test_a_job_runs_on_its_model_or_one_of_those_it_accepts() -> None:
    fleet = FleetDispatcher()
    fleet.submit("one", member="m", model="sdxl", now=0.0)
    fleet.submit("any", member="m", needs={"models": ["sdxl", "flux_1"]}, now=0.0)
    fleet.submit("none", member="m", now=0.0)
    one, either, plain = (fleet.job(j) for j in ("one", "any", "none"))
    assert [one.runs_on(m) for m in ("sdxl", "flux_1", None)] == [True, False, False]
    assert [either.runs_on(m) for m in ("sdxl", "flux_1", "sd15")] == [True, True, False]
    assert [plain.runs_on(m) for m in (None, "sdxl")] == [True, False]
