"""The broker's TOML configuration: defaults, every key, and errors that name the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prioqueue import ConfigError
from prioqueue.broker import load_config, parse_config
from prioqueue.cli import main


def test_defaults() -> None:
    config = parse_config({})
    assert (config.host, config.port) == ("127.0.0.1", 8091)
    assert config.store == "sqlite:prioqueue-broker.db"
    assert config.advertise == "http://127.0.0.1:8091"
    assert config.keys == {}
    assert config.worker_timeout_seconds == 120.0


def test_every_key() -> None:
    config = parse_config(
        {
            "listen": "0.0.0.0:9000",
            "advertise": "http://10.0.0.5:9000/",
            "store": "postgresql://u@db:5432/jobs",
            "store_schema": "broker",
            "default_lease_seconds": 60,
            "max_attempts": 5,
            "worker_timeout_seconds": 0,
            "max_queued": 100,
            "max_queued_per_member": 10,
            "max_running_per_member": 1,
            "warm_hold_seconds": 5,
            "fair_share": False,
            "charge": "estimate",
            "max_body_bytes": 4096,
            "result_max_bytes": 1000,
            "result_ttl_seconds": 60,
            "retry_after_seconds": 3,
            "leader_lease_seconds": 4,
            "snapshot_every": 50,
            "sqlite_synchronous": "normal",
            "lease": {
                "minimum_seconds": 100,
                "strict_samplers": True,
                "slow_baseline_multipliers": {"sd3": 2},
            },
            "keys": {
                "sk-a": {
                    "role": "submitter",
                    "member": "alice",
                    "tier": "max",
                    "max_priority": 100,
                },
                "wk": {"role": "worker", "workers": ["gpu-a"], "workers_prefix": "gpu-b"},
            },
        }
    )
    assert (config.host, config.port, config.advertise) == ("0.0.0.0", 9000, "http://10.0.0.5:9000")
    assert config.worker_timeout_seconds is None
    assert config.max_running_per_member == 1
    assert config.lease.minimum_seconds == 100
    assert config.lease.strict_samplers
    assert config.lease.seconds(width=64, height=64, steps=1, sampler="k_euler") == 100
    assert config.keys["sk-a"].member == "alice"
    assert config.keys["sk-a"].max_priority == 100
    assert config.keys["wk"].role == "worker"
    assert config.keys["wk"].workers == frozenset({"gpu-a"})
    assert [config.keys["wk"].may_act_as(w) for w in ("gpu-a", "gpu-b2", "gpu-c")] == [
        True, True, False,
    ]  # fmt: skip
    assert config.charge == "estimate"


def test_load_seconds_reach_the_fleet_and_price_the_affinity() -> None:
    """``[load_seconds]`` goes to the broker's fleet: a model's affinity is worth at most its
    load in waiting (docs/design/fleet.md, "Affinity as a priced trade"), here 30 s over the
    divisor's 60 s of aging per point; a model without a load keeps the scorer's bonus."""
    from crossing_support import granted_affinity
    from prioqueue.broker._fleet import make_fleet
    from prioqueue.scoring import Scorer

    config = parse_config({"load_seconds": {"sdxl": 30, "flux-dev": 0.0}})
    assert dict(config.load_seconds) == {"sdxl": 30.0, "flux-dev": 0.0}
    assert parse_config({}).load_seconds == {}
    scorer = Scorer(config.scoring)
    divisor = config.scoring.aging_divisor
    assert 30.0 / divisor < scorer.affinity("sdxl")  # the price binds: the test can fail

    def affinity_granted(model: str, loads: dict[str, float] | None) -> float:
        config = parse_config({"load_seconds": loads or {}})
        return granted_affinity(make_fleet(config, lambda job, info: 60.0), model)

    assert affinity_granted("sdxl", {"sdxl": 30}) == pytest.approx(30.0 / divisor)
    assert affinity_granted("sdxl", None) == scorer.affinity("sdxl")
    assert affinity_granted("other", {"sdxl": 30}) == scorer.affinity("other")


def test_observer_and_admin_flags() -> None:
    keys = {
        "sk-a": {"role": "submitter", "member": "alice"},
        "sk-o": {"role": "submitter", "member": "ops", "observer": True},
        "sk-r": {"role": "submitter", "member": "root", "admin": True},
    }
    config = parse_config({"keys": keys})
    plain, observer, admin = (config.keys[k] for k in ("sk-a", "sk-o", "sk-r"))
    assert (plain.observer, plain.admin, observer.observer, admin.admin) == (
        False, False, True, True,
    )  # fmt: skip
    rights = [(k.may_read(m), k.may_cancel(m)) for k in (plain, observer, admin) for m in "ab"]
    assert (plain.may_read("alice"), plain.may_cancel("alice")) == (True, True)
    assert rights == [
        (False, False), (False, False),  # alice's key: neither "a" nor "b" is alice
        (True, False), (True, False),  # observer: reads anyone's
        (True, True), (True, True),  # admin: reads and cancels anyone's
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"lsiten": "x"}, "lsiten: unknown key"),
        ({"listen": "nowhere"}, "listen: expected 'host:port'"),
        ({"store": "mysql://x"}, "store: expected 'sqlite:PATH'"),
        ({"store": "sqlite://host/x.db"}, "store: a sqlite URL has no host"),
        ({"advertise": "10.0.0.1:80"}, "advertise: expected an http://"),
        ({"max_attempts": 0}, "max_attempts: must be >= 1"),
        ({"default_lease_seconds": -1}, "default_lease_seconds: must be > 0"),
        ({"result_ttl_seconds": "1d"}, "result_ttl_seconds: must be a finite number"),
        ({"sqlite_synchronous": "off"}, 'sqlite_synchronous: must be "full" or "normal"'),
        ({"keys": {"k": {"role": "admin"}}}, 'keys.k.role: must be "submitter" or "worker"'),
        ({"keys": {"k": {}}}, "keys.k.role"),
        ({"keys": {"k": {"role": "submitter"}}}, "keys.k.member: is required"),
        (
            {"keys": {"k": {"role": "submitter", "member": "m", "tier": "gold"}}},
            "keys.k.tier: unknown tier 'gold'",
        ),
        (
            {"keys": {"k": {"role": "worker", "workers_prefix": "", "member": "m"}}},
            "keys.k.member: unknown key",
        ),
        ({"keys": {"k": {"role": "worker"}}}, "keys.k.workers: a worker key names the worker"),
        ({"keys": {"k": {"role": "worker", "workers": []}}}, "keys.k.workers: must be a non"),
        ({"keys": {"k": {"role": "worker", "workers": "g"}}}, "keys.k.workers: must be a non"),
        ({"keys": {"k": {"role": "worker", "workers_prefix": 1}}}, "keys.k.workers_prefix"),
        (
            {"keys": {"k": {"role": "submitter", "member": "m", "workers": ["g"]}}},
            "keys.k.workers: only a worker key",
        ),
        ({"metrics_public": "yes"}, "metrics_public: must be true or false"),
        ({"max_queued_bytes": -1}, "max_queued_bytes: must be >= 0"),
        ({"connections": {"header_timeout": 0}}, "connections.header_timeout: must be > 0"),
        ({"connections": {"max_connections": 0}}, "connections.max_connections: must be >= 1"),
        ({"connections": {"idle": 1}}, "connections.idle: unknown key"),
        ({"keys": {"a b": {"role": "worker"}}}, 'keys."a b": an API key must'),
        (
            {"keys": {"k": {"role": "submitter", "member": "m", "observer": "yes"}}},
            "keys.k.observer: must be true or false, got 'yes'",
        ),
        (
            {"keys": {"k": {"role": "submitter", "member": "m", "admin": 1}}},
            "keys.k.admin: must be true or false, got 1",
        ),
        (
            {"keys": {"k": {"role": "worker", "observer": True}}},
            "keys.k.observer: only a submitter key may have it",
        ),
        ({"keys": {"k": {"role": "worker", "admin": False}}}, "keys.k.admin: only a submitter"),
        ({"lease": {"minimum_seconds": 0}}, "lease: LeaseCalculator.minimum_seconds"),
        ({"lease": {"speed": 1}}, "lease.speed: unknown key"),
        ({"load_seconds": 20}, "load_seconds: must be a table, got 20"),
        ({"load_seconds": {"sdxl": -1}}, "load_seconds.sdxl: must be >= 0, got -1"),
        ({"load_seconds": {"sdxl": "20s"}}, "load_seconds.sdxl: must be a finite number"),
        ({"load_seconds": {"flux.1": float("inf")}}, 'load_seconds."flux.1": must be a finite'),
        ({"load_seconds": {" ": 5}}, 'load_seconds." ": a model name must not be empty'),
    ],
)
def test_errors_name_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="broker.toml: ")
    assert str(info.value).startswith("broker.toml: ")
    assert message in str(info.value)


def test_load_config_file_errors_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        'listen = "127.0.0.1:1"\n[keys."w"]\nrole = "worker"\nworkers = ["g"]\n', encoding="utf-8"
    )
    config = load_config(path, listen="127.0.0.1:2", store="memory://")
    assert (config.port, config.store) == (2, "memory://")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    path.write_text("listen = ", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)
    assert load_config(None).keys == {}


def test_cli_check_openapi_and_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('store = "memory://"\n', encoding="utf-8")
    assert main(["broker", "--config", str(path), "--check"]) == 0
    assert "configuration OK" in capsys.readouterr().out
    assert main(["broker", "--config", str(path), "--openapi"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert "/v1/workers/{worker}/pop" in spec["paths"]
    path.write_text("max_attempts = 0\n", encoding="utf-8")
    assert main(["broker", "--config", str(path)]) == 2
    assert "max_attempts" in capsys.readouterr().err


def test_a_corrupt_store_stops_the_broker_with_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    db.write_bytes(b"this is not an SQLite database" * 100)
    path = tmp_path / "broker.toml"
    path.write_text(f'listen = "127.0.0.1:0"\nstore = "sqlite:///{db}"\n', encoding="utf-8")
    code = "import sys; from prioqueue.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, "broker", "--config", str(path), "--log-level", "critical"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "prioqueue broker: cannot start:" in result.stderr
    line = result.stderr.split("cannot start:")[1].splitlines()[0]
    assert "broker.db" in line


def test_the_example_config_is_valid_and_documents_every_key() -> None:
    import attrs

    from prioqueue.broker import BrokerConfig

    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "examples" / "broker.toml")
    assert config.keys["wk-fleet"].role == "worker"
    text = (root / "examples" / "broker.toml").read_text(encoding="utf-8")
    documented = {"listen", "store", "store_schema"} | {
        line.split("=")[0].strip("# ").strip() for line in text.splitlines() if "=" in line
    }
    documented |= {  # tables: [budgets.<level>], [backoff]
        line.strip("# ").split("]")[0].strip("[").split(".")[0]
        for line in text.splitlines()
        if line.strip("# ").startswith("[")
    }
    fields = {f.name for f in attrs.fields(BrokerConfig)} - {"host", "port", "scoring"}
    fields = {"keys" if f == "keys" else f for f in fields} - {"keys", "policy", "lease"}
    assert fields <= documented, fields - documented


def test_the_published_openapi_description_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    assert main(["broker", "--config", str(root / "examples" / "broker.toml"), "--openapi"]) == 0
    generated = json.loads(capsys.readouterr().out)
    published = json.loads((root / "docs" / "broker-openapi.json").read_text(encoding="utf-8"))
    assert generated == published, (
        "regenerate: prioqueue broker --openapi > docs/broker-openapi.json"
    )


def test_sigterm_stops_the_broker_cleanly(tmp_path: Path) -> None:
    import signal

    import httpx

    from .broker_helpers import BrokerProcess, free_port, run, write_config

    port = free_port()
    config = write_config(tmp_path / "broker.toml", port, f"sqlite:///{tmp_path / 'b.db'}")
    broker = BrokerProcess(config, port, tmp_path / "broker.log").start()

    async def serve() -> None:
        async with httpx.AsyncClient() as client:
            await broker.wait_serving(client)
            r = await client.post(
                f"{broker.url}/v1/jobs", json={}, headers={"Authorization": "Bearer sk-alice"}
            )
            assert r.status_code == 201

    try:
        run(serve())
        broker.signal(signal.SIGTERM)
        assert broker.proc is not None
        assert broker.proc.wait(timeout=120) == 0
    finally:
        broker.kill()
