"""Issue 29 item 4: a job's fields are declared once (``prioqueue.jobfields``).

What forwards a field reads the declaration; what types a field is checked against it here,
layer by layer: a field declared and not typed, or typed and not declared, fails.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioqueue._spec import SUBMIT_OPTIONS, JobSpec
from prioqueue.broker import parse_config
from prioqueue.broker._http import submit_args
from prioqueue.broker.models import JobView, SubmitRequest
from prioqueue.broker.records import JobRecord, fingerprint, submit_digest
from prioqueue.client import jobs_cli
from prioqueue.client.broker import SubmitFields
from prioqueue.jobfields import JOB_FIELDS, LAYERS, field_named, fields_in, names_in


def test_names_are_unique_and_layers_known() -> None:
    names = [f.name for f in JOB_FIELDS]
    assert len(names) == len(set(names))
    digests = [f.digest for f in JOB_FIELDS if f.digest is not None]
    assert len(digests) == len(set(digests))
    for f in JOB_FIELDS:
        assert f.layers, f.name
        assert f.layers <= set(LAYERS), f.name
        assert f.doc.strip(), f.name
    with pytest.raises(ValueError, match="unknown layers"):
        fields_in("nowhere")  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        field_named("nowhere")


def test_the_core_options_are_the_declared_core_fields() -> None:
    assert set(names_in("core")) == SUBMIT_OPTIONS
    keywords = {
        p.name
        for p in inspect.signature(JobSpec.checked).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert keywords == SUBMIT_OPTIONS


def test_the_request_body_is_the_declared_request_fields_in_order() -> None:
    assert tuple(SubmitRequest.model_fields) == names_in("request")
    for name, info in SubmitRequest.model_fields.items():
        assert info.description == field_named(name).doc, name
        assert info.default is None, name  # absent: the broker's default applies


def test_every_request_field_reaches_the_engine() -> None:
    # The request-to-journal step copies only engine fields: a request field that is not
    # one would be accepted and dropped.
    assert set(names_in("request")) <= set(names_in("engine"))
    assert {f.name for f in fields_in("engine") if f.required} == {"member", "tier", "priority"}


def test_the_record_keeps_the_declared_record_fields() -> None:
    kept = {a.name for a in attrs.fields(JobRecord)}
    assert set(names_in("record")) <= kept
    assert set(names_in("record")) <= set(names_in("engine"))  # copied from the submit


def test_the_job_view_answers_the_declared_view_fields() -> None:
    assert set(names_in("view")) <= set(JobView.model_fields)
    assert set(names_in("view")) <= set(names_in("record"))  # read from the record


def test_the_client_keywords_are_the_declared_client_fields_in_order() -> None:
    assert tuple(SubmitFields.__annotations__) == names_in("client")
    assert set(names_in("client")) <= set(names_in("request"))


def test_the_cli_has_a_flag_per_declared_cli_field() -> None:
    parser = argparse.ArgumentParser()
    jobs_cli.add_arguments(parser)
    args = parser.parse_args(["submit"])
    for f in fields_in("cli"):
        assert f.cli is not None, f.name
        assert "client" in f.layers, f.name
        assert hasattr(args, f.name), f.name


def test_the_broker_guide_names_every_request_field() -> None:
    guide = Path(__file__).resolve().parent.parent / "docs" / "broker.md"
    row = next(
        line
        for line in guide.read_text(encoding="utf-8").splitlines()
        if "| `POST /v1/jobs` |" in line
    )
    missing = [name for name in names_in("request") if f"`{name}`" not in row]
    assert missing == []


_VALUES = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_OLD_ALWAYS = {"m": "model", "e": "estimate", "g": "group", "i": "image", "b": "payload"}
_OLD_IF_SET = {"t": "ttl", "n": "not_before", "a": "max_attempts", "k": "backoff"}


@given(
    st.integers(-100, 100),
    st.dictionaries(
        st.sampled_from([*_OLD_ALWAYS.values(), *_OLD_IF_SET.values(), "tier"]),
        _VALUES,
    ),
)
def test_the_idempotency_digest_of_a_submit_without_new_fields_never_changes(
    priority: int, args: dict[str, Any]
) -> None:
    # Journals and snapshots keep digests: the declaration must reproduce the formula they
    # were written with (before jobfields), or a replayed key would answer 422. (``needs``
    # joined the digest later, counted only when set: see test_broker_labels.)
    old = {"p": priority, **{short: args.get(name) for short, name in _OLD_ALWAYS.items()}}
    old.update({s: args[n] for s, n in _OLD_IF_SET.items() if args.get(n) is not None})
    assert submit_digest({"priority": priority, **args}) == fingerprint(old)


_BODY = {
    "priority": 5, "model": "m", "estimate": 2.0, "group": "g", "payload": {"a": [1]},
    "ttl": 5.0, "not_before": 10.0, "max_attempts": 3, "backoff": {"base": 1.0},
    "needs": {"pixels": 4},
}  # fmt: skip


@given(st.sets(st.sampled_from(sorted(_BODY))), st.one_of(st.none(), st.just("key-1")))
def test_a_journal_row_has_the_shape_it_had_before_the_declaration(
    chosen: set[str], idempotency_key: str | None
) -> None:
    config = parse_config(
        {
            "store": "memory://",
            "keys": {"sk": {"role": "submitter", "member": "a", "max_priority": 100}},
        }
    )
    key = config.keys["sk"]
    body = SubmitRequest.model_validate({name: _BODY[name] for name in chosen})
    args = submit_args(body, key, config, None, dict, idempotency_key=idempotency_key)
    old: dict[str, Any] = {
        "member": "a", "tier": key.tier, "priority": 5 if "priority" in chosen else 0,
        "model": body.model, "estimate": body.estimate, "group": body.group, "image": None,
        "payload": body.payload, "idempotency_key": idempotency_key,
    }  # fmt: skip
    lifecycle = {
        "ttl": body.ttl, "not_before": body.not_before, "max_attempts": body.max_attempts,
        "backoff": None if body.backoff is None else body.backoff.model_dump(),
        "needs": None if body.needs is None else body.needs.model_dump(),
    }  # fmt: skip
    old.update({name: value for name, value in lifecycle.items() if value is not None})
    assert args == old
    assert list(args) == list(old)  # the same order too (the journal's JSON text)
