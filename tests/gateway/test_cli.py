"""``cotenant gateway`` as a user runs it: a real subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cotenant.cli.main import main
from tests.conftest import ROOT
from tests.gateway.conftest import ModelServer, free_port


def _run(
    args: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    token: str | None = None,
) -> tuple[int, str]:
    """Run the CLI in-process (the same code path as the command line); returns the exit
    code and stderr. Only the checks before the gateway starts are exercised this way."""
    monkeypatch.delenv("COTENANT_GATEWAY_TOKEN", raising=False)
    if token is not None:
        monkeypatch.setenv("COTENANT_GATEWAY_TOKEN", token)
    try:
        code = main(["gateway", *args])
    except SystemExit as exc:  # argparse refuses a value it cannot parse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_refuses_to_start_without_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = _run(["--upstream", "http://127.0.0.1:9"], capsys, monkeypatch)
    assert code != 0
    assert "no control API token: pass --token-file PATH or set COTENANT_GATEWAY_TOKEN" in err
    empty = tmp_path / "token"
    empty.write_text("\n")
    code, err = _run(
        ["--upstream", "http://127.0.0.1:9", "--token-file", str(empty)], capsys, monkeypatch
    )
    assert code != 0 and "the file is empty" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--listen", "8080"], "--listen '8080': give :PORT or HOST:PORT"),
        (["--control", "h:99999"], "--control 'h:99999'"),
        (["--model-from", "cookie:x"], "--model-from 'cookie:x': use body[:FIELD]"),
        (["--model-from", "path:(["], "invalid regular expression"),
        (["--upstream", "ftp://x"], "give an http:// or https:// URL"),
        (["--max-concurrency", "0"], "--max-concurrency 0"),
        (["--queue-timeout", "nan"], "--queue-timeout: 'nan' is not a finite duration"),
        (["--idle-timeout", "5x"], "--idle-timeout: '5x' is not a duration"),
        (["--upstream", "a b=http://h:1"], "--upstream name 'a b': a replica name is 1-64"),
        (["--upstream", "gpu0=ftp://h"], "--upstream 'ftp://h': give an http://"),
        (
            ["--upstream", "a=http://h:1", "--upstream", "a=http://h:2"],
            "upstream 'a' is given twice",
        ),
        (["--eject-after", "-1"], "--eject-after -1: give an integer >= 0"),
        (["--eject-time", "0"], "--eject-time 0.0: give a finite number > 0"),
        (["--idle-timeout", "soon"], "--idle-timeout: 'soon' is not a duration"),
        (["--max-connections", "-1"], "--max-connections -1: give a finite number >= 0"),
        (["--max-connections-per-client", "-5"], "--max-connections-per-client -5"),
        (["--http-parser", "h11"], "invalid choice: 'h11'"),
    ],
)
def test_bad_flags_are_refused_with_a_message(
    args: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = args if "--upstream" in args[:1] else ["--upstream", "http://127.0.0.1:9", *args]
    code, err = _run(full, capsys, monkeypatch, token="t")
    assert code != 0
    assert needle in err, err


def test_bad_config_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("[limits.llama]\nrate_rps = -1\nburst = 2\n")
    code, err = _run(
        ["--upstream", "http://127.0.0.1:9", "--config", str(cfg)], capsys, monkeypatch, token="t"
    )
    assert code != 0 and "limits.llama.rate_rps must be a finite number > 0" in err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[routes.llama]\nweights = {gpu9 = 1}\n", "weights: no upstream named 'gpu9'"),
        ("[routes.llama]\nweights = {u = 0}\n", "routes.llama.weights: at least one weight"),
        ("[routes.llama]\nweights = {u = 1}\npolicy = 'random'\n", "routes.llama.policy 'random'"),
        ("[upstreams.g]\nurl = 'http://h:1'\nreserve_slots = 2\n", "set max_in_flight"),
        ("[upstreams.g]\nurl = 'http://h:1'\nmax_in_flight = 2\nreserve_slots = 3\n", "is more"),
        ("[upstreams.g]\nurl = 'http://h:1'\nweight = 300\n", "upstreams.g.weight must be"),
        ("[upstreams.g]\nurl = 'http://h:1'\nport = 3\n", "unknown key 'port'"),
        ("[upstreams.g]\nweight = 1\n", "upstreams.g: url is required"),
        ("[upstreams.u]\nurl = 'http://h:1'\n", "upstream 'u' is given twice"),
        ("[routing]\neject_after = -2\n", "routing.eject_after must be an integer from 0"),
        ("[routing]\nmode = 1\n", "routing: unknown key 'mode'"),
    ],
)  # fmt: skip
def test_bad_routing_config_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    needle: str,
) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text(text)
    args = ["--upstream", "u=http://127.0.0.1:9", "--config", str(cfg)]
    code, err = _run(args, capsys, monkeypatch, token="t")
    assert code != 0 and needle in err, err


def test_no_upstream_at_all_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = _run([], capsys, monkeypatch, token="t")
    assert code != 0 and "no upstream: give --upstream URL" in err


def test_replicas_from_flags_and_config(model_server: ModelServer, tmp_path: Path) -> None:
    """Two replicas by flag and one from the config file, least-loaded."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        f"[upstreams.c]\nurl = '{model_server.url}'\nweight = 0\n"
        f"[routes.victim]\nweights = {{c = 1}}\n[routing]\neject_after = 3\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "cotenant", "gateway",
         "--upstream", f"a={model_server.url}", "--upstream", f"b={model_server.url}",
         "--routing", "least-loaded", "--config", str(cfg),
         "--http-parser", "builtin", "--max-connections", "64",
         "--max-connections-per-client", "8",
         "--listen", f"127.0.0.1:{free_port()}", "--control", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "COTENANT_GATEWAY_TOKEN": "tok"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        assert fields["replicas"] == "a,b,c" and fields["upstream"] == model_server.url
        for model in ("victim", "other", "other"):
            r = httpx.post(f"{fields['proxy']}/v1/completions", json={"model": model}, timeout=10)
            assert r.status_code == 200
        st = httpx.get(
            f"{fields['control']}/control/v1/state",
            headers={"Authorization": "Bearer tok"},
            timeout=5,
        ).json()
        assert st["routes"]["*"]["policy"] == "least-loaded"
        assert st["routes"]["victim"]["weights"] == {"c": 1}
        assert st["replicas"]["c"]["sent_total"] == 1
        assert st["replicas"]["a"]["sent_total"] + st["replicas"]["b"]["sent_total"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_runs_proxies_and_stops_on_sigterm(
    model_server: ModelServer, tmp_path: Path, loop: str
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = tmp_path / "gw.toml"
    cfg.write_text("[limits.llama]\nrate_rps = 0.5\nburst = 1\n[priorities]\nllama = 3\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cotenant", "gateway", "--upstream", model_server.url,
         "--listen", f"127.0.0.1:{free_port()}", "--control", f"127.0.0.1:{free_port()}",
         "--token-file", str(token), "--config", str(cfg), "--priority-field", "vllm",
         "--loop", loop],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening proxy="), line
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        r = httpx.post(f"{fields['proxy']}/v1/completions", json={"model": "llama"}, timeout=10)
        assert r.status_code == 200
        assert model_server.bodies[-1]["body"]["priority"] == 3
        r = httpx.post(f"{fields['proxy']}/v1/completions", json={"model": "llama"}, timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        st = httpx.get(
            f"{fields['control']}/control/v1/state",
            headers={"Authorization": "Bearer s3cret"},
            timeout=5,
        ).json()
        assert st["models"]["llama"]["rate_rps"] == 0.5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stderr is not None
        assert "s3cret" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def test_sample_ratio_is_checked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = _run(
        ["--upstream", "http://127.0.0.1:9", "--otlp-sample-ratio", "0"], capsys, monkeypatch, "t"
    )
    assert code != 0 and "--otlp-sample-ratio 0.0: give 0 < R <= 1" in err


def test_loop_uvloop_without_uvloop_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from cotenant.cli.gateway import loop_factory
    from cotenant.core.errors import UsageError

    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    assert loop_factory("auto") is None  # auto falls back to asyncio's loop
    with pytest.raises(UsageError, match=r"uvloop is not installed .*--loop asyncio"):
        loop_factory("uvloop")


def test_flags_left_out_take_the_settings_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One place for the gateway's defaults: GatewaySettings. The command line without
    flags builds exactly its defaults, listening on all interfaces (clients are elsewhere)
    and controlled on loopback."""
    import argparse

    from cotenant.cli.gateway import add_parser, settings_from_args
    from cotenant.gateway.settings import GatewaySettings

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    monkeypatch.setenv("COTENANT_GATEWAY_TOKEN", "t")
    got = settings_from_args(parser.parse_args(["gateway", "--upstream", "http://127.0.0.1:9"]))
    want = GatewaySettings(upstream="http://127.0.0.1:9", token="t", routing=got.routing)
    assert got == want
    assert (got.listen, got.control) == (("0.0.0.0", 8080), ("127.0.0.1", 8081))
    given = settings_from_args(
        parser.parse_args(
            ["gateway", "--upstream", "http://127.0.0.1:9", "--max-queue", "7", "--listen", ":9"]
        )
    )
    assert (given.max_queue, given.listen, given.max_concurrency) == (7, ("0.0.0.0", 9), 256)
    help_text = (
        parser.format_help()
        + parser._subparsers._group_actions[0]
        .choices[  # type: ignore[union-attr]
            "gateway"
        ]
        .format_help()
    )
    assert "default 256" in help_text and "default 127.0.0.1:8081" in help_text
