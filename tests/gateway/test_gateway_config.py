from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crossing_support import FAST, ROUND_TRIP, granted, granted_affinity, warm_size_one
from prioqueue import ConfigError, FleetDispatcher, SizeOneDispatcher
from prioqueue.gateway import Gateway
from prioqueue.gateway.config import (
    DEFAULT_GATED_PATHS,
    ApiKey,
    load_config,
    parse_config,
    parse_listen,
)
from prioqueue.scoring import Scorer, ScoringConfig

ROOT = Path(__file__).resolve().parents[2]

FULL = """
upstream = "http://10.0.0.5:8080/"
listen = "0.0.0.0:9000"
allow_anonymous = true
anonymous_max_priority = -100
gated_paths = ["/v1/chat/completions", "/v1/images/*"]
charge = 1.5
upstream_api_key = "upstream-secret"

[tiers]
free = 0
gold = 3

[policy]
minimum = -100
maximum = 100
[policy.aliases]
urgent = 50

[scoring]
aging_divisor = 30
max_affinity = 5

[limits]
max_queued = 10
max_queued_per_member = 3
lease_seconds = 60
[limits.lease_seconds_by_path]
"/v1/images/generations" = 1800
[limits.max_wait_seconds]
interactive = 30
urgent = 45
"-100" = 0
default = 600

[resident]
poll_seconds = 2

[trusted_header]
member = "X-Auth-User"
tier = "X-Auth-Tier"
max_priority = 100

[keys."sk-alice"]
member = "alice"
tier = "gold"
max_priority = 100
"""


def test_full_configuration(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(FULL, encoding="utf-8")
    config = load_config(path)
    assert config.upstream == "http://10.0.0.5:8080"
    assert (config.host, config.port, config.listen) == ("0.0.0.0", 9000, "0.0.0.0:9000")
    assert config.anonymous_max_priority == -100
    assert config.keys == {"sk-alice": ApiKey("alice", "gold", 100)}
    assert config.scoring.tier_bonuses == {"free": 0, "gold": 3}
    assert config.scoring.aging_divisor == 30
    assert config.policy.parse("urgent") == 50
    assert config.charge == 1.5
    assert config.limits.lease_for("/v1/images/generations") == 1800
    assert config.limits.lease_for("/v1/chat/completions") == 60
    assert config.limits.max_wait_for(100) == 30
    assert config.limits.max_wait_for(50) == 45
    assert config.limits.max_wait_for(-100) is None
    assert config.limits.max_wait_for(0) == 600
    assert config.trusted_header is not None
    assert config.trusted_header.member == "x-auth-user"
    assert config.resident_poll_seconds == 2
    assert config.is_gated("POST", "/v1/images/edits")
    assert config.is_gated("GET", "/v1/chat/completions")  # listed: every method
    assert config.is_gated("POST", "/v1/embeddings")  # every POST
    assert not config.is_gated("GET", "/v1/embeddings")
    assert not config.is_gated("POST", "/v1/models")  # a pass-through path


def test_no_file_allows_anonymous_and_overrides_apply() -> None:
    config = load_config(None, upstream="http://127.0.0.1:1234", listen="127.0.0.1:0")
    assert config.allow_anonymous
    assert config.upstream == "http://127.0.0.1:1234"
    assert config.port == 0
    assert config.gated_paths == DEFAULT_GATED_PATHS


def test_file_defaults_refuse_anonymous(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text('upstream = "http://127.0.0.1:8080"\n', encoding="utf-8")
    assert not load_config(path).allow_anonymous
    assert load_config(path, upstream="http://[::1]:1").upstream == "http://[::1]:1"


def test_the_example_configuration_is_valid() -> None:
    config = load_config(ROOT / "examples" / "gateway.toml")
    assert config.keys


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[keys."abc"]\nmember = "a"\ntier = "gold"\n',
            "keys.abc.tier: unknown tier 'gold' (known: free, pro, max)",
        ),
        ('[keys."a.b"]\nmember = "a"\ncolour = 1\n', 'keys."a.b".colour: unknown key'),
        ('[keys."k"]\ntier = "pro"\n', "keys.k.member: is required"),
        ("upstrem = 'http://x'\n", "upstrem: unknown key"),
        ("upstream = 'ftp://x'\n", "upstream: expected an http:// or https:// URL"),
        ("listen = 'localhost'\n", "listen: expected 'host:port'"),
        ("allow_anonymous = 1\n", "allow_anonymous: must be true or false"),
        ("anonymous_max_priority = 'high'\n", "anonymous_max_priority: must be an integer"),
        ("[limits]\nlease_seconds = -1\n", "limits.lease_seconds: must be > 0"),
        ("[limits]\nmax_queued = 0\n", "limits.max_queued: must be >= 1"),
        ("[limits.max_wait_seconds]\nsoon = 5\n", "limits.max_wait_seconds.soon: not a priority"),
        ("[limits.lease_seconds_by_path]\nx = 5\n", "limits.lease_seconds_by_path.x: a path"),
        ("gated_paths = ['v1']\n", "gated_paths: must be a list of paths"),
        ("[scoring]\nmax_affinity = 200\n", "scoring: band_spacing"),
        ("[policy]\nminimum = 5\nmaximum = 1\n", "policy: minimum (5)"),
        ("[trusted_header]\ntier = 'x'\n", "trusted_header.member: is required"),
        ("charge = 'sometimes'\n", "charge: must be a finite number"),
        ("[tiers]\nfree = -1\n", "tiers.free: must be >= 0"),
        ("keys = 3\n", "keys: must be a table"),
        ("gated_methods = ['P OST']\n", "gated_methods: must be a list of HTTP method names"),
        ("passthrough_paths = 'v1'\n", "passthrough_paths: must be a list of paths"),
        ("admin_paths = ['api']\n", "admin_paths: must be a list of paths"),
        (
            "[limits.lease_seconds_by_path]\n'/a*/b' = 5\n",
            "limits.lease_seconds_by_path.\"/a*/b\": '*' may only end a path",
        ),
        ("[limits]\nmax_header_count = 0\n", "limits.max_header_count: must be >= 1"),
        ("[limits]\ndrain_seconds = 0\n", "limits.drain_seconds: must be > 0"),
        ('[keys."k"]\nmember = "m"\nadmin = "yes"\n', "keys.k.admin: must be true or false"),
        ("metrics_key = ''\n", "metrics_key: must be a non-empty string"),
        ("upstreams = []\n", "upstreams: must be a non-empty array of tables"),
        ("[[upstreams]]\nname = 'a'\n", "upstreams[0].url: is required"),
        ("[[upstreams]]\nurl = 'ftp://x'\n", "upstreams[0].url: expected an http://"),
        (
            "[[upstreams]]\nurl = 'http://a:1'\n[[upstreams]]\nurl = 'http://a:1'\n",
            "upstreams[1].name: 'a:1' names two upstreams",
        ),
        ("[[upstreams]]\nurl = 'http://a:1'\nslots = 0\n", "upstreams[0].slots: must be >= 1"),
        ("[[upstreams]]\nurl = 'http://a:1'\nmodels = []\n", "upstreams[0].models: must be"),
        ("[[upstreams]]\nurl = 'http://a:1'\ngpu = 1\n", "upstreams[0].gpu: unknown key"),
        (
            "upstream = 'http://a:1'\n[[upstreams]]\nurl = 'http://b:1'\n",
            "upstream: give either upstream or [[upstreams]], not both",
        ),
        ("routing = 'random'\n", "routing: must be warm, round-robin or least-busy"),
        ("warm_hold = -1\n", "warm_hold: must be >= 0"),
        ("max_attempts = 0\n", "max_attempts: must be >= 1"),
        ("load_seconds = 12\n", "load_seconds: must be a table, got 12"),
        ("[load_seconds]\nllama = -2\n", "load_seconds.llama: must be >= 0, got -2"),
        ("[load_seconds]\nllama = true\n", "load_seconds.llama: must be a finite number"),
        ('[load_seconds]\n"" = 1\n', 'load_seconds."": a model name must not be empty'),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: {message}" in str(info.value)


def test_unreadable_or_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    path = tmp_path / "bad.toml"
    path.write_text("a = [", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_override_errors_name_the_option() -> None:
    with pytest.raises(ConfigError, match="--upstream"):
        parse_config({}, upstream="nope")
    with pytest.raises(ConfigError, match="--listen"):
        parse_config({}, listen="1.2.3.4:99999")


def test_roles_limits_and_route_lists() -> None:
    config = parse_config(
        {
            "keys": {"a": {"member": "a", "admin": True}, "o": {"member": "o", "observer": True}},
            "gated_methods": ["post"],
            "passthrough_paths": ["/v1/embeddings"],
            "metrics_key": "scrape",
            "limits": {"drain_seconds": 2, "max_header_count": 10},
        }
    )
    assert config.keys["a"] == ApiKey("a", "free", 0, observer=True, admin=True)
    assert config.keys["o"].observer
    assert not config.keys["o"].admin
    assert config.gated_methods == ("POST",)
    assert not config.is_gated("POST", "/v1/embeddings")
    assert not config.is_gated("PUT", "/v1/chat/completions")
    assert config.is_gated("GET", "/upstream/m/x")
    assert config.is_admin("/api/models/unload")
    assert (config.limits.drain_seconds, config.limits.max_header_count) == (2.0, 10)
    assert config.metrics_key == "scrape"
    by_prefix = parse_config({"limits": {"lease_seconds_by_path": {"/v1/images/*": 60}}})
    assert by_prefix.limits.lease_for("/v1/images/generations") == 60
    assert by_prefix.limits.lease_for("/v1/chat/completions") == 900


def test_parse_listen() -> None:
    assert parse_listen(":8090") == ("127.0.0.1", 8090)
    assert parse_listen("[::1]:80") == ("::1", 80)
    config = parse_config({"listen": "[::1]:81"})
    assert config.listen == "[::1]:81"


def test_command_line_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prioqueue.cli import main

    assert main(["gateway", "--config", str(ROOT / "examples" / "gateway.toml"), "--check"]) == 0
    assert "configuration OK" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text('[keys."k"]\nmember = "m"\ntier = "gold"\n', encoding="utf-8")
    assert main(["gateway", "--config", str(bad)]) == 2
    assert "keys.k.tier: unknown tier 'gold'" in capsys.readouterr().err


def test_load_seconds_reach_the_single_upstreams_dispatcher() -> None:
    """``[load_seconds]`` reaches the dispatcher in front of one upstream: after a first
    crossing, a film shot for the loaded model crosses an image that waited 5 s, since
    deferring it would cost two loads (90 s + 60 s) against the 100 s the image waits
    (docs/design/dispatcher.md, "Issue 26, seventh round"); without the loads the shot is
    deferred (``crossing_support.warm_size_one``)."""

    def next_grant(loads: dict[str, float] | None) -> str:
        data: dict[str, Any] = {"scoring": {"aging_divisor": FAST.config.aging_divisor}}
        if loads is not None:
            data["load_seconds"] = loads
        d = Gateway(parse_config(data)).dispatcher
        assert isinstance(d, SizeOneDispatcher)
        return granted(warm_size_one(d), 400.0)

    assert parse_config({}).load_seconds == {}
    assert next_grant(ROUND_TRIP) == "g.0"
    assert next_grant(None) == "img1"


def test_load_seconds_price_the_affinity_on_several_upstreams() -> None:
    """On several upstreams a model's affinity is worth at most its load in waiting
    (docs/design/fleet.md, "Affinity as a priced trade"): 30 s of load over 60 s of aging per
    point is half a point; a model without a load keeps the scorer's bonus."""

    def affinity(model: str, loads: dict[str, float]) -> float:
        data = {"upstreams": [{"url": "http://127.0.0.1:9", "name": "a"}], "load_seconds": loads}
        fleet = Gateway(parse_config(data)).dispatcher
        assert isinstance(fleet, FleetDispatcher)
        return granted_affinity(fleet, model)

    full = Scorer(ScoringConfig()).affinity("llama")
    assert full > 0.5  # the price binds: the test can fail
    assert affinity("llama", {"llama": 30.0}) == pytest.approx(0.5)
    assert affinity("llama", {}) == full
    assert affinity("qwen", {"llama": 30.0}) == full


def test_several_upstreams() -> None:
    config = parse_config(
        {
            "upstreams": [
                {"url": "http://10.0.0.5:8080/", "name": "gpu0", "models": ["a", "b"]},
                {"url": "http://10.0.0.6:8080", "slots": 2, "slow": True},
            ],
            "warm_hold": 5,
            "routing": "least-busy",
        }
    )
    first, second = config.upstreams
    assert (first.url, first.name, first.models, first.slots, first.slow) == (
        "http://10.0.0.5:8080",
        "gpu0",
        ("a", "b"),
        1,
        False,
    )
    assert (second.name, second.models, second.slots, second.slow) == (
        "10.0.0.6:8080",
        None,
        2,
        True,
    )
    assert (config.warm_hold, config.routing, config.max_attempts) == (5.0, "least-busy", 2)
    single = parse_config({})
    assert single.upstreams == ()
    assert single.warm_hold == 15.0


def test_upstream_option_and_several_upstreams_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {"upstreams": [{"url": "http://10.0.0.5:8080", "name": "gpu0"}]}
    with pytest.raises(ConfigError, match=r"--upstream: \[\[upstreams\]\] lists the upstreams"):
        parse_config(data, upstream="http://10.0.0.6:8080")
    from prioqueue.cli import main

    path = tmp_path / "fleet.toml"
    path.write_text('[[upstreams]]\nurl = "http://10.0.0.5:8080"\nname = "gpu0"\n', "utf-8")
    assert main(["gateway", "--config", str(path), "--check"]) == 0
    assert "upstreams gpu0=http://10.0.0.5:8080" in capsys.readouterr().out
    assert main(["gateway", "--config", str(path), "--upstream", "http://x:1", "--check"]) == 2
    assert "[[upstreams]] lists the upstreams" in capsys.readouterr().err


def test_the_keys_in_the_guides_requests_are_keys_of_the_example_configuration() -> None:
    # docs/gateway.md starts the gateway with examples/gateway.toml; a request it shows with
    # another key would be a 401 for anyone who follows it (issue 21).
    import re
    from pathlib import Path

    from prioqueue._service.config import _load_toml

    root = Path(__file__).parents[2]
    example = _load_toml((root / "examples" / "gateway.toml").read_text())
    guide = (root / "docs" / "gateway.md").read_text()
    used = set(re.findall(r'Bearer (sk-[\w-]+)|api_key="(sk-[\w-]+)"', guide))
    keys = {a or b for a, b in used}
    assert keys, "the guide shows no request with a key"
    assert keys <= set(example["keys"]), keys - set(example["keys"])


def test_busy_settings_at_the_top_and_per_upstream() -> None:
    top = parse_config({"aborts": True, "busy_timeout": 30, "idle_path": "/queue"})
    assert (top.aborts, top.busy_timeout, top.idle_path) == (True, 30.0, "/queue")
    fleet = parse_config(
        {
            "busy_timeout": 30,
            "upstreams": [
                {"url": "http://a:1", "name": "a"},
                {"url": "http://b:1", "name": "b", "aborts": True, "idle_path": "http://b:2/q"},
            ],
        }
    )
    a, b = fleet.upstreams
    assert (a.aborts, a.busy_timeout, a.idle_path) == (False, 30.0, None)
    assert (b.aborts, b.busy_timeout, b.idle_path) == (True, 30.0, "http://b:2/q")
    with pytest.raises(ConfigError, match="idle_path: must be a path starting with '/'"):
        parse_config({"idle_path": "queue"})
    with pytest.raises(ConfigError, match="busy_timeout"):
        parse_config({"upstreams": [{"url": "http://a:1", "busy_timeout": 0}]})
    with pytest.raises(ConfigError, match="max_idle_connections"):
        parse_config({"limits": {"max_idle_connections": 0}})
