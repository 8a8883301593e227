"""cotenant.app.config: defaults < TOML file < COTENANT_ environment, checked once, and the CLI."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cotenant.app.config import Config, load_config
from cotenant.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "cotenant.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m cotenant ARGS`` with no inherited COTENANT_ variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("COTENANT_")}
    return subprocess.run(
        [sys.executable, "-m", "cotenant", *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- defaults, file, environment ---------------------------------------------------------


def test_defaults_without_file_or_env() -> None:
    cfg = load_config(None, {})
    assert cfg == Config()
    assert cfg.server.port == 8050
    assert cfg.otlp.http_port == 4318
    assert cfg.otlp.grpc_port == 4317
    assert cfg.store.path == "./.cotenant/cotenant.duckdb"
    assert cfg.store.raw_retention_h == 24.0
    assert cfg.log.level == "info"
    assert cfg.gpu.model_gpu == {}


def test_map_default_is_not_shared_between_configs() -> None:
    first = load_config(None, {})
    first.gpu.model_gpu["leaked"] = "3"
    assert load_config(None, {}).gpu.model_gpu == {}


def test_file_overrides_only_the_keys_it_names(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [server]
        port = 9000
        [otlp]
        grpc_enabled = false
        retry_after_s = 3
        [store]
        path = "/data/x.duckdb"
        raw_retention_h = 6.5
        [gpu]
        model_gpu = { llama = "0", "resnet-50" = 1 }
        [log]
        level = "debug"
        """,
    )
    cfg = load_config(path, {})
    assert cfg.server.port == 9000
    assert cfg.server.host == "127.0.0.1"  # untouched key keeps its default
    assert cfg.otlp.grpc_enabled is False
    assert cfg.otlp.http_enabled is True
    assert cfg.otlp.retry_after_s == 3.0
    assert isinstance(cfg.otlp.retry_after_s, float)
    assert cfg.store.path == "/data/x.duckdb"
    assert cfg.store.raw_retention_h == 6.5
    assert cfg.gpu.model_gpu == {"llama": "0", "resnet-50": "1"}
    assert cfg.log.level == "debug"


def test_environment_beats_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 9000\nhost = "0.0.0.0"\n')
    cfg = load_config(path, {"COTENANT_SERVER_PORT": "9100"})
    assert cfg.server.port == 9100
    assert cfg.server.host == "0.0.0.0"


def test_unrelated_and_known_non_config_variables_are_ignored() -> None:
    cfg = load_config(None, {"HOME": "/root", "COTENANT_CONFIG": "/etc/x.toml", "PATH": "/bin"})
    assert cfg == Config()


def test_env_defaults_to_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COTENANT_SERVER_PORT", "8123")
    assert load_config().server.port == 8123


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "On"])
def test_env_bool_true(raw: str) -> None:
    assert load_config(None, {"COTENANT_OTLP_GRPC_ENABLED": raw}).otlp.grpc_enabled is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "OFF"])
def test_env_bool_false(raw: str) -> None:
    assert load_config(None, {"COTENANT_OTLP_GRPC_ENABLED": raw}).otlp.grpc_enabled is False


def test_env_int_and_float_are_cast() -> None:
    cfg = load_config(
        None,
        {
            "COTENANT_OTLP_GRPC_WORKERS": " 8 ",
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.25",
            "COTENANT_STORE_RAW_RETENTION_H": "48",
        },
    )
    assert cfg.otlp.grpc_workers == 8
    assert cfg.store.flush_interval_s == 0.25
    assert cfg.store.raw_retention_h == 48.0
    assert isinstance(cfg.store.raw_retention_h, float)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a=0,b=1", {"a": "0", "b": "1"}),
        (" llama = GPU-1234 , resnet=3,", {"llama": "GPU-1234", "resnet": "3"}),
        ("", {}),
    ],
)
def test_env_map(raw: str, expected: dict[str, str]) -> None:
    assert load_config(None, {"COTENANT_GPU_MODEL_GPU": raw}).gpu.model_gpu == expected


def test_env_map_replaces_file_map(tmp_path: Path) -> None:
    path = write(tmp_path, '[gpu]\nmodel_gpu = { x = "5" }\n')
    cfg = load_config(path, {"COTENANT_GPU_MODEL_GPU": "a=0"})
    assert cfg.gpu.model_gpu == {"a": "0"}


# --- rejected configurations ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key", "value"),
    [
        ('[server]\nport = "eighty"\n', "server.port", "eighty"),
        ("[server]\nport = 80.5\n", "server.port", "80.5"),
        ("[server]\nport = true\n", "server.port", "True"),
        ("[server]\nport = 70000\n", "server.port", "70000"),
        ("[server]\nport = -1\n", "server.port", "-1"),
        ("[otlp]\nhttp_enabled = 1\n", "otlp.http_enabled", "1"),
        ('[otlp]\nhttp_enabled = "yes"\n', "otlp.http_enabled", "yes"),
        ("[otlp]\nretry_after_s = 301\n", "otlp.retry_after_s", "301"),
        ('[otlp]\nretry_after_s = "1"\n', "otlp.retry_after_s", "'1'"),
        ("[otlp]\nretry_after_s = nan\n", "otlp.retry_after_s", "nan"),
        ("[store]\nraw_retention_h = inf\n", "store.raw_retention_h", "inf"),
        ("[store]\nflush_interval_s = 0.001\n", "store.flush_interval_s", "0.001"),
        ("[store]\nthreads = 0\n", "store.threads", "0"),
        ("[store]\npath = 5\n", "store.path", "5"),
        ('[log]\nlevel = "loud"\n', "log.level", "loud"),
        ('[gpu]\nmodel_gpu = "a=0"\n', "gpu.model_gpu", "a=0"),
        ("[gpu]\nmodel_gpu = { a = true }\n", "gpu.model_gpu", "True"),
        ("[gpu]\nmodel_gpu = { a = 1.5 }\n", "gpu.model_gpu", "1.5"),
    ],
)
def test_bad_file_value_names_key_and_value(
    tmp_path: Path, toml: str, key: str, value: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, toml), {})
    msg = str(err.value)
    assert f"config key {key}:" in msg
    assert value in msg


@pytest.mark.parametrize(
    ("var", "raw", "key"),
    [
        ("COTENANT_SERVER_PORT", "http", "server.port"),
        ("COTENANT_SERVER_PORT", "80.0", "server.port"),
        ("COTENANT_SERVER_PORT", "65536", "server.port"),
        ("COTENANT_SERVER_PORT", "", "server.port"),
        ("COTENANT_OTLP_HTTP_ENABLED", "maybe", "otlp.http_enabled"),
        ("COTENANT_OTLP_RETRY_AFTER_S", "soon", "otlp.retry_after_s"),
        ("COTENANT_OTLP_RETRY_AFTER_S", "nan", "otlp.retry_after_s"),
        ("COTENANT_OTLP_RETRY_AFTER_S", "-0.5", "otlp.retry_after_s"),
        ("COTENANT_STORE_RAW_RETENTION_H", "inf", "store.raw_retention_h"),
        ("COTENANT_OTLP_GRPC_WORKERS", "65", "otlp.grpc_workers"),
        ("COTENANT_LOG_LEVEL", "INFO", "log.level"),
        ("COTENANT_GPU_MODEL_GPU", "llama", "gpu.model_gpu"),
        ("COTENANT_GPU_MODEL_GPU", "a=0,=1", "gpu.model_gpu"),
        ("COTENANT_GPU_MODEL_GPU", "a=", "gpu.model_gpu"),
    ],
)
def test_bad_env_value_names_key_variable_and_value(var: str, raw: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {var: raw})
    msg = str(err.value)
    assert key in msg
    assert var in msg
    assert repr(raw) in msg


def test_env_error_wins_over_valid_file_value(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = 9000\n")
    with pytest.raises(ConfigError, match=r"server\.port.*'x'"):
        load_config(path, {"COTENANT_SERVER_PORT": "x"})


def test_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "[sever]\nport = 1\n"), {})
    assert "sever" in str(err.value)
    assert "unknown section" in str(err.value)
    assert "server" in str(err.value)  # lists the known ones


def test_section_that_is_not_a_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config key server: bad value 5"):
        load_config(write(tmp_path, "server = 5\n"), {})


def test_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "[server]\nprot = 8080\n"), {})
    msg = str(err.value)
    assert "server.prot" in msg
    assert "unknown key" in msg
    assert "port" in msg


def test_unknown_cotenant_variable() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"COTENANT_SERVER_PROT": "8080"})
    assert "COTENANT_SERVER_PROT" in str(err.value)
    assert "not a cotenant config key" in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as err:
        load_config(missing, {})
    assert str(missing) in str(err.value)
    assert "does not exist" in str(err.value)


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 80\nhost = "unterminated\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    assert str(path) in str(err.value)
    assert "not valid TOML" in str(err.value)
    assert "line 3" in str(err.value)


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[server]\nhost = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(path, {})


# --- TOML output round trip -----------------------------------------------------------------


def test_default_toml_round_trips(tmp_path: Path) -> None:
    text = Config().to_toml()
    assert load_config(write(tmp_path, text), {}) == Config()


def test_toml_lists_every_key_with_help() -> None:
    text = Config().to_toml()
    parsed = tomllib.loads(text)
    assert parsed == Config().to_dict()
    assert "# port of the HTTP API, /metrics and dashboard" in text


def test_awkward_strings_round_trip(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        {
            "COTENANT_STORE_PATH": 'C:\\data\\"odd"\tname\nwith\x7fcontrol\x01 ü 🚀.duckdb',
            "COTENANT_GPU_MODEL_GPU": 'm"1=GPU\\0,ü=1',
        },
    )
    back = load_config(write(tmp_path, cfg.to_toml()), {})
    assert back == cfg
    assert back.store.path.endswith("🚀.duckdb")


def _random_value(rnd: random.Random, f: dataclasses.Field[Any]) -> Any:
    typ = str(f.type)
    lo, hi, choices = f.metadata["min"], f.metadata["max"], f.metadata["choices"]
    if f.metadata["secret"]:
        return ""  # a secret that is set is printed hidden: see the test below
    if choices:
        return rnd.choice(choices)
    if typ == "bool":
        return rnd.random() < 0.5
    if typ == "int":
        return rnd.randint(int(lo if lo is not None else -5), int(hi if hi is not None else 10**9))
    if typ == "float":
        low = lo if lo is not None else 0.0
        high = hi if hi is not None else low + 1000.0
        return rnd.choice([low, high, rnd.uniform(low, high), rnd.uniform(low, low + 1e-3)])
    alphabet = "ab/\\\"' =,\t\nü{}[]#"
    if typ == "str":
        return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))
    assert typ.startswith("dict"), typ
    value: Any = (
        (lambda: rnd.uniform(0.1, 1e4))
        if typ == "dict[str, float]"
        else (lambda: str(rnd.randint(0, 7)))
    )
    return {
        "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 6))): value()
        for _ in range(rnd.randint(0, 3))
    }


def test_random_configs_round_trip_through_toml(tmp_path: Path) -> None:
    rnd = random.Random(20261202)
    for i in range(60):
        sections = {}
        for s in dataclasses.fields(Config):
            typ = s.default_factory  # type: ignore[misc]
            sections[s.name] = typ(
                **{f.name: _random_value(rnd, f) for f in dataclasses.fields(typ)}
            )
        cfg = Config(**sections)
        back = load_config(write(tmp_path, cfg.to_toml(), f"c{i}.toml"), {})
        assert back == cfg, cfg


def test_secrets_are_never_printed_in_clear() -> None:
    cfg = load_config(
        None,
        {"COTENANT_ACTUATORS_TOKEN": "tok-123456", "COTENANT_ACTUATORS_WEBHOOK_SECRET": "hmac-k"},
    )
    text = cfg.to_toml()
    assert "tok-123456" not in text and "hmac-k" not in text
    assert 'token = "<hidden>"' in text and 'webhook_secret = "<hidden>"' in text
    assert 'token_file = ""' in text  # not a secret: a path


# --- command line ---------------------------------------------------------------------------


def test_cli_config_show_reflects_file_and_env(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[server]\nport = 9000\n[otlp]\nhttp_port = 14318\n[gpu]\nmodel_gpu = { m = "2" }\n',
    )
    res = cli(
        "config",
        "show",
        "--config",
        str(path),
        env={"COTENANT_SERVER_PORT": "9100", "COTENANT_LOG_LEVEL": "warning"},
    )
    assert res.returncode == 0, res.stderr
    shown = tomllib.loads(res.stdout)
    assert shown["server"]["port"] == 9100  # env beats file
    assert shown["otlp"]["http_port"] == 14318  # file beats default
    assert shown["otlp"]["grpc_port"] == 4317  # default
    assert shown["log"]["level"] == "warning"
    assert shown["gpu"]["model_gpu"] == {"m": "2"}


def test_cli_config_show_round_trips(tmp_path: Path) -> None:
    path = write(tmp_path, '[store]\npath = "/tmp/a b/\\"q\\".duckdb"\nthreads = 4\n')
    env = {"COTENANT_STORE_RAW_RETENTION_H": "0.5", "COTENANT_GPU_MODEL_GPU": "a=0,b=1"}
    res = cli("config", "show", "--config", str(path), env=env)
    assert res.returncode == 0, res.stderr
    shown = write(tmp_path, res.stdout, "shown.toml")
    assert load_config(shown, {}) == load_config(path, env)


def test_cli_uses_cotenant_config_variable_and_store_flag(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = 9300\n")
    res = cli("config", "show", "--store", "/srv/s.duckdb", env={"COTENANT_CONFIG": str(path)})
    assert res.returncode == 0, res.stderr
    shown = tomllib.loads(res.stdout)
    assert shown["server"]["port"] == 9300
    assert shown["store"]["path"] == "/srv/s.duckdb"


@pytest.mark.parametrize(
    ("toml", "env", "needles"),
    [
        ("[server]\nport = 99999\n", {}, ["server.port", "99999"]),
        ('[log]\nlevel = "chatty"\n', {}, ["log.level", "chatty"]),
        ("[server]\nprot = 1\n", {}, ["server.prot"]),
        ("", {"COTENANT_OTLP_HTTP_PORT": "x"}, ["otlp.http_port", "COTENANT_OTLP_HTTP_PORT"]),
        ("", {"COTENANT_NOPE": "1"}, ["COTENANT_NOPE"]),
        ("[server\n", {}, ["not valid TOML"]),
    ],
)
def test_cli_bad_config_exits_2_naming_the_key(
    tmp_path: Path, toml: str, env: dict[str, str], needles: list[str]
) -> None:
    path = write(tmp_path, toml)
    res = cli("config", "show", "--config", str(path), env=env)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.startswith("cotenant: error: ")
    for needle in needles:
        assert needle in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_missing_config_file_exits_2(tmp_path: Path) -> None:
    res = cli("config", "show", "--config", str(tmp_path / "absent.toml"))
    assert res.returncode == 2
    assert "absent.toml" in res.stderr
