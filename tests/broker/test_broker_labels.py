"""A job's ``labels`` (issue 29: the field added by the recipe of docs/design/state.md).

The rule (``prioqueue.jobfields.checked_labels``), the field end to end (the body, the
journal, the record, ``GET /v1/jobs/{id}``, the dashboard, the client, the CLI), its
durability (journal replay and snapshot restore on SQLite) and its idempotency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioqueue.broker import BrokerEngine, Rejected, parse_config
from prioqueue.cli import main
from prioqueue.client import Broker
from prioqueue.jobfields import MAX_LABEL_VALUE, MAX_LABELS, checked_labels
from prioqueue.store import WallClock

from .broker_helpers import OPS, SUBMITTER, Clock, api, run
from .test_broker_store import served
from .test_client_fleet import _broker

_KEY = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}", fullmatch=True)
_VALUE = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")),
    max_size=MAX_LABEL_VALUE,
).filter(str.isprintable)
LABELS = st.dictionaries(_KEY, _VALUE, max_size=MAX_LABELS)
ROOM_FOR_ONE = st.dictionaries(_KEY, _VALUE, max_size=MAX_LABELS - 1)
"""Labels one more of which is still within the count: the bad one is refused for itself."""


@given(LABELS)
def test_the_rule_keeps_bounded_labels_as_they_are(labels: dict[str, str]) -> None:
    checked = checked_labels(labels)
    assert checked == labels
    assert checked is not labels  # a copy: the caller's dict is never kept
    assert checked_labels(None) is None


@given(ROOM_FOR_ONE, st.sampled_from(["", " x", "-x", "a b", "x\n", "x" * 64, "é"]))
def test_the_rule_refuses_a_bad_key(labels: dict[str, str], key: str) -> None:
    with pytest.raises(ValueError, match="label key"):
        checked_labels({**labels, key: "v"})


@given(ROOM_FOR_ONE, st.sampled_from(["x" * (MAX_LABEL_VALUE + 1), "a\nb", "\x00", 5, None, ["v"]]))
def test_the_rule_refuses_a_bad_value(labels: dict[str, str], value: Any) -> None:
    with pytest.raises(ValueError, match="label 'k'"):
        checked_labels({**labels, "k": value})


def test_the_rule_bounds_the_count_and_the_type() -> None:
    assert checked_labels({f"k{i}": "" for i in range(MAX_LABELS)}) is not None
    with pytest.raises(ValueError, match=f"at most {MAX_LABELS} labels"):
        checked_labels({f"k{i}": "" for i in range(MAX_LABELS + 1)})
    with pytest.raises(ValueError, match="object of strings"):
        checked_labels(["a=b"])


def test_labels_are_kept_answered_journaled_and_shown() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit(labels={"team": "render", "shot": "12"})
            plain = await a.submit()
            view = (await a.job(job)).json()
            assert view["labels"] == {"team": "render", "shot": "12"}
            assert (await a.job(plain)).json()["labels"] is None
            # Sparse: a job without labels journals the same row as before the field existed.
            rows = [entry.args for entry in a.journal.entries if entry.op == "submit"]
            assert rows[0]["labels"] == {"team": "render", "shot": "12"}
            assert "labels" not in rows[1]
            batch = await a.client.post(
                "/v1/jobs/batch", json={"jobs": [{"labels": {"a": "1"}}, {}]}, headers=SUBMITTER
            )
            first, second = batch.json()["ids"]
            assert (await a.job(first)).json()["labels"] == {"a": "1"}
            assert (await a.job(second)).json()["labels"] is None
            panel = await a.client.get("/v1/dashboard", params={"job": job}, headers=OPS)
            assert panel.json()["job"]["labels"] == {"team": "render", "shot": "12"}
            assert a.replays()

    run(scenario())


@pytest.mark.parametrize(
    "labels",
    [{"bad key": "x"}, {"k": 1}, {"k": "x" * (MAX_LABEL_VALUE + 1)}, ["k"], "k=v"],
)
def test_bad_labels_are_a_422_naming_the_field(labels: Any) -> None:
    async def scenario() -> None:
        async with api() as a:
            answer = await a.client.post("/v1/jobs", json={"labels": labels}, headers=SUBMITTER)
            assert answer.status_code == 422, answer.text
            assert answer.json()["field"].startswith("labels")
            assert await a.queued() == 0

    run(scenario())


def test_other_labels_under_the_same_key_are_another_request() -> None:
    async def scenario() -> None:
        async with api() as a:
            headers = {**SUBMITTER, "Idempotency-Key": "k1"}
            first = await a.client.post("/v1/jobs", json={"labels": {"a": "1"}}, headers=headers)
            again = await a.client.post("/v1/jobs", json={"labels": {"a": "1"}}, headers=headers)
            other = await a.client.post("/v1/jobs", json={"labels": {"a": "2"}}, headers=headers)
            assert (first.status_code, again.status_code) == (201, 200)
            assert first.json() == again.json()
            assert other.status_code == 422

    run(scenario())


def test_other_needs_under_the_same_key_are_another_request() -> None:
    # needs joined the idempotency digest late (a sparse field: keys of jobs without needs
    # keep their digests); before, the same key with other needs replayed the first job.
    async def scenario() -> None:
        async with api() as a:
            headers = {**SUBMITTER, "Idempotency-Key": "k2"}
            lora = {"needs": {"features": ["lora"]}}
            first = await a.client.post("/v1/jobs", json=lora, headers=headers)
            again = await a.client.post("/v1/jobs", json=lora, headers=headers)
            other = await a.client.post(
                "/v1/jobs", json={"needs": {"features": ["controlnet"]}}, headers=headers
            )
            bare = await a.client.post("/v1/jobs", json={}, headers=headers)
            assert (first.status_code, again.status_code) == (201, 200)
            assert first.json() == again.json()
            assert (other.status_code, bare.status_code) == (422, 422)

    run(scenario())


def test_a_journal_row_with_bad_labels_is_refused_naming_them() -> None:
    engine = BrokerEngine(parse_config({"store": "memory://"}))
    row = {"member": "m", "tier": "free", "priority": 0, "labels": {"a": ["not", "text"]}}
    with pytest.raises(Rejected) as refused:
        engine.apply("submit", row, 1.0)
    assert (refused.value.status, refused.value.field) == (422, "labels")
    assert engine.snapshot()["jobs"] == []


def test_a_snapshot_from_before_labels_restores_without_them() -> None:
    config = parse_config({"store": "memory://"})
    engine = BrokerEngine(config)
    engine.apply("submit", {"member": "m", "tier": "free", "priority": 0}, 1.0)
    snapshot = engine.snapshot()
    for record in snapshot["jobs"]:
        del record["labels"]  # written before the field existed
    restored = BrokerEngine.restore(snapshot, config)
    assert restored.jobs["job-1"].labels is None


def test_labels_survive_a_restart_on_sqlite(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'broker.db'}"
    clock = Clock()

    async def scenario() -> None:
        ids: list[str] = []
        options = {"store": store, "snapshot_every": 2}
        async with served(clock=WallClock(source=clock), **options) as (c, _):
            for i in range(5):  # snapshots after the 2nd and 4th: the 5th is replayed
                body = {"labels": {"n": str(i)}} if i % 2 == 0 else {}
                ids.append((await c.post("/v1/jobs", json=body, headers=SUBMITTER)).json()["id"])
        async with served(clock=WallClock(source=clock), store=store) as (c, broker):
            assert broker.recovered_entries > 0
            for i, job_id in enumerate(ids):
                view = (await c.get(f"/v1/jobs/{job_id}", headers=SUBMITTER)).json()
                assert view["labels"] == ({"n": str(i)} if i % 2 == 0 else None)

    run(scenario())


def test_labels_travel_from_the_client_and_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _broker(tmp_path, "sqlite") as proc:
        base = ["jobs", "--broker", proc.url, "--key", "sk-alice"]
        assert main([*base, "submit", "--label", "team=render", "--label", "shot=a=b"]) == 0
        cli_id = json.loads(capsys.readouterr().out)["id"]
        assert main([*base, "submit", "--label", "nonsense"]) == 2
        assert "--label: expected KEY=VALUE" in capsys.readouterr().err
        assert main([*base, "submit", "--label", "bad key=x"]) == 1
        assert "labels" in capsys.readouterr().err
        with Broker(proc.url, "sk-alice") as client:
            made = client.submit(labels={"team": "client"})
            assert client.get(cli_id)["labels"] == {"team": "render", "shot": "a=b"}
            assert client.get(made)["labels"] == {"team": "client"}
