"""``prioqueue gateway --record FILE``: every queued request, once it leaves, as a trace line."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from prioqueue.gateway import Gateway, parse_config
from prioqueue.gateway.cli import _open_recorder
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

from .gateway_helpers import CHAT, chat, run, wait_for


class ListRecorder:
    def __init__(self, fail: bool = False) -> None:
        self.rows: list[dict[str, Any]] = []
        self.fail = fail

    def record(self, **fields: Any) -> None:
        if self.fail:
            raise OSError("disk full")
        self.rows.append(fields)

    def close(self) -> None:
        pass


def _serve(recorder: ListRecorder, config: dict[str, Any]) -> tuple[FakeLlamaSwap, list[Any]]:
    fake = FakeLlamaSwap()
    up = ServerThread(fake).start()
    data = {"allow_anonymous": True, "anonymous_max_priority": 100, **config}
    gateway = Gateway(parse_config(data, upstream=up.url), recorder=recorder)
    gw = ServerThread(gateway, limits=gateway.config.limits).start()
    return fake, [up, gw]


def test_finished_and_cancelled_requests_are_recorded() -> None:
    recorder = ListRecorder()
    fake, servers = _serve(recorder, {"limits": {"max_queued": 2}, "estimate_seconds": 3.0})
    url = servers[1].url

    async def go() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            holder = asyncio.ensure_future(
                client.post(
                    CHAT,
                    json=chat(hold="gpu", seconds=0.2),
                    headers={"X-LlamaSwap-Priority": "100"},
                )
            )
            await wait_for(lambda: fake.active == 1)
            leaver = asyncio.ensure_future(client.post(CHAT, json=chat("model-b")))
            queued = asyncio.ensure_future(client.post(CHAT, json=chat("model-b")))

            async def two_queued() -> bool:
                return bool((await client.get("/prioqueue/status")).json()["queued"] == 2)

            await wait_for(two_queued)
            full = await client.post(CHAT, json=chat())
            assert full.status_code == 429  # refused before it queued: not recorded
            leaver.cancel()  # the client leaves while queued
            await wait_for(lambda: len(recorder.rows) == 1)
            fake.release("gpu")
            assert (await holder).status_code == 200
            assert (await queued).status_code == 200

    try:
        run(go())
        run(wait_for(lambda: len(recorder.rows) == 3))
    finally:
        for server in reversed(servers):
            server.stop()
    left, *ran = recorder.rows
    assert left["cancel_after"] > 0
    assert left["runtime"] == 0.0
    assert left["model"] == "model-b"
    by_priority = {row["priority"]: row for row in ran}
    first = by_priority[100]
    assert first["runtime"] >= 0.2
    assert first["swap"] is True  # nothing was loaded before it
    assert "cancel_after" not in first
    assert (first["member"], first["tier"], first["estimate"]) == ("anonymous", "free", 3.0)
    assert by_priority[0]["swap"] is True  # model-a to model-b
    assert first["arrival"] < left["arrival"]


def test_a_failing_recorder_never_fails_a_request(caplog: pytest.LogCaptureFixture) -> None:
    recorder = ListRecorder(fail=True)
    _, servers = _serve(recorder, {})
    try:
        with httpx.Client(base_url=servers[1].url, timeout=10) as client:
            assert client.post(CHAT, json=chat()).status_code == 200
            assert client.post(CHAT, json=chat()).status_code == 200
    finally:
        for server in reversed(servers):
            server.stop()
    failures = [r for r in caplog.records if "recording the trace failed" in r.getMessage()]
    assert len(failures) == 1  # logged once


def test_record_without_the_recorder_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from prioqueue.cli import main

    monkeypatch.setitem(sys.modules, "prioqueue.sim.recorder", None)
    target = tmp_path / "trace.jsonl"
    assert main(["gateway", "--listen", "127.0.0.1:0", "--record", str(target)]) == 1
    error = capsys.readouterr().err
    assert "--record" in error
    assert "prioqueue.sim.recorder" in error
    assert not target.exists()


def test_record_writes_a_trace_the_simulator_reads(tmp_path: Path) -> None:
    pytest.importorskip("prioqueue.sim.recorder")  # the simulator's recorder (issue 12)
    target = tmp_path / "trace.jsonl"
    recorder = _open_recorder(str(target))
    recorder.record(arrival=1.0, member="m", priority=0, runtime=0.5, model="a", swap=True)
    recorder.close()
    lines = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert lines[1]["member"] == "m"


def test_a_trace_from_record_charges_an_unmeasured_load_once(tmp_path: Path) -> None:
    # A non-streamed swap's cold load cannot be told from its inference: it stays in the
    # duration. The trace says loads not measured cost 0 s more (default_load), so a replay
    # does not add its 30 s default on top (issue 21).
    pytest.importorskip("prioqueue.sim.recorder")
    target = tmp_path / "trace.jsonl"
    _open_recorder(str(target)).close()
    header = json.loads(target.read_text(encoding="utf-8").splitlines()[0])
    assert header["default_load"] == 0.0
    known = tmp_path / "known.jsonl"
    _open_recorder(str(known), load_seconds={"model-a": 4.0}, default_load=2.0).close()
    header = json.loads(known.read_text(encoding="utf-8").splitlines()[0])
    assert header["load_seconds"] == {"model-a": 4.0}
    assert header["default_load"] == 2.0


def test_a_known_load_is_recorded_apart_from_a_non_streamed_swap() -> None:
    recorder = ListRecorder()
    fake = FakeLlamaSwap(load_seconds=0.3)
    up = ServerThread(fake).start()
    data = {"allow_anonymous": True}
    gateway = Gateway(
        parse_config(data, upstream=up.url), recorder=recorder, record_loads={"model-a": 0.25}
    )
    gw = ServerThread(gateway, limits=gateway.config.limits).start()
    try:
        with httpx.Client(base_url=gw.url, timeout=10) as client:
            assert client.post(CHAT, json=chat("model-a", seconds=0.1)).status_code == 200
            assert client.post(CHAT, json=chat("model-b", seconds=0.1)).status_code == 200
    finally:
        gw.stop()
        up.stop()
    first, second = recorder.rows
    assert first["swap"]
    assert first["load"] == 0.25
    assert first["runtime"] >= 0.1
    assert second["swap"]
    assert "load" not in second
    assert second["runtime"] >= 0.3 + 0.1


def test_the_configured_load_seconds_are_known_loads_and_record_load_overrides_them(
    tmp_path: Path,
) -> None:
    """``[load_seconds]`` are the recording's known loads too; ``--record-load`` wins."""
    pytest.importorskip("prioqueue.sim.recorder")
    import argparse

    from prioqueue.gateway.cli import _recorder

    config = parse_config({"load_seconds": {"model-a": 4.0, "model-b": 7.0}})
    target = tmp_path / "trace.jsonl"
    args = argparse.Namespace(
        record=str(target), record_load=["model-b=2.5"], record_default_load=0.0
    )
    recorder, loads = _recorder(args, config)
    recorder.close()
    assert loads == {"model-b": 2.5}  # what the gateway gets as record_loads
    header = json.loads(target.read_text(encoding="utf-8").splitlines()[0])
    assert header["load_seconds"] == {"model-a": 4.0, "model-b": 2.5}
    gateway = Gateway(config, record_loads={"model-b": 2.5})
    assert gateway.record_loads == {"model-a": 4.0, "model-b": 2.5}
    assert Gateway(config).record_loads == {"model-a": 4.0, "model-b": 7.0}
    assert config.recording_loads() == dict(config.load_seconds)  # the dispatcher's, untouched
    assert config.load_seconds == {"model-a": 4.0, "model-b": 7.0}


def test_record_load_values_are_checked() -> None:
    from prioqueue.gateway.cli import _record_loads

    assert _record_loads(["flux=12.5", "qwen=0"]) == {"flux": 12.5, "qwen": 0.0}
    for bad in ("flux", "=3", "flux=-1", "flux=soon", "flux=inf"):
        with pytest.raises(ValueError, match="MODEL=SECONDS"):
            _record_loads([bad])
