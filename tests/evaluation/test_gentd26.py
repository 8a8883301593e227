"""evaluation/gentd26 and gentd26_diagnosis: the Alibaba GenTD26 loader, the spike/incident
diagnosis with its model_load cause, and ``cotenant bench --gentd26``."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from cotenant.cli.main import main
from cotenant.core.errors import TraceError
from cotenant.evaluation.gentd26 import SERIES, STEP_S, Trace, load_trace
from cotenant.evaluation.gentd26_diagnosis import (
    bench,
    column_median,
    diagnose,
    iso,
    summarize,
    trailing_median_mad,
)

T0 = 1_662_858_720
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "alibaba-gentd26"
Row = tuple[int, float, str]


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _csv(
    rows: Sequence[Row], order: Sequence[str], extra: dict[str, list[str]] | None = None
) -> bytes:
    cols = list(order) + list(extra or {})
    lines = [",".join(cols)]
    for i, (ts, v, ip) in enumerate(rows):
        rec = {"timestamp_anon": str(ts), "value": repr(v), "container_ip": ip}
        rec.update({k: vals[i] for k, vals in (extra or {}).items()})
        lines.append(",".join(rec[c] for c in cols))
    return ("\n".join(lines) + "\n").encode()


def write_trace(folder: Path, rows: dict[str, list[Row]]) -> Path:
    """A GenTD26-shaped folder: every archive of SERIES, with the rows given per series name
    (``qps`` rows get ``request_type``; a ``._`` AppleDouble member beside the e2e CSV; the
    duty-cycle CSV with the columns in another order)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, files in SERIES.items():
        r = rows.get(name, [])
        order = ("timestamp_anon", "value", "container_ip")
        extra = None
        if name == "duty_cycle":
            order = ("value", "timestamp_anon", "container_ip")
        if name == "queue_rt":
            order = ("container_ip", "value", "timestamp_anon")
        if name == "qps":
            extra = {
                "request_type": [
                    "API Requests" if ip == "" else "Generative Requests" for _, _, ip in r
                ]
            }
        members = {f"{files[0][: -len('.tar.gz')]}.csv": _csv(r, order, extra)}
        if name == "e2e":
            members = {"._x.csv": b"\x00\x05\x16\x07\xff binary", **members}
        _tar(folder / files[0], members)
    return folder


def ts(step: int) -> int:
    return T0 + STEP_S * step


# ---- the loader -------------------------------------------------------------------------


def test_loader_picks_columns_by_name_and_skips_appledouble(tmp_path: Path) -> None:
    folder = write_trace(
        tmp_path / "t",
        {
            "e2e": [(ts(0), 1000.0, "aa"), (ts(2), 1500.5, "bb")],
            "duty_cycle": [(ts(1), 42.0, "bb"), (ts(3), 7.0, "cc")],
            "queue_rt": [(ts(2), 200.0, "bb")],
            "qps": [(ts(1), 0.09, "aa"), (ts(1), 1.5, ""), (ts(2), 2.0, "")],
            "queue_size": [(ts(0), 1.0, "")],
            "load_lora": [(ts(0), 4000.0, "aa")],
        },
    )
    t = load_trace(folder)
    assert t.containers == ("aa", "bb", "cc")
    assert t.ts.tolist() == [ts(i) for i in range(4)]
    e2e = t.panels["e2e"]
    assert e2e[0, 0] == 1000.0 and e2e[2, 1] == 1500.5
    assert np.isnan(e2e[1]).all()
    assert t.panels["duty_cycle"][1, 1] == 42.0 and t.panels["duty_cycle"][3, 2] == 7.0
    assert t.panels["queue_rt"][2, 1] == 200.0
    assert t.panels["qps"][1, 0] == 0.09
    assert t.cluster["api_qps"][1:3].tolist() == [1.5, 2.0]
    assert t.cluster["queue_size"][0] == 1.0
    assert t.load("lora")[0, 0] == 4000.0
    # aa serves without ControlNet: pool A; cc has GPU telemetry only
    assert t.models() == ["sd-pool-a", "sd-pool-a", "sd-idle"]


def test_missing_folder_and_file_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such folder"):
        load_trace(tmp_path / "absent")
    folder = write_trace(tmp_path / "t", {"e2e": [(ts(0), 1.0, "aa")]})
    (folder / "qps.tar.gz").unlink()
    with pytest.raises(TraceError, match=r"qps\.tar\.gz: missing"):
        load_trace(folder)


def test_bad_columns_not_a_tar_and_off_grid_are_refused(tmp_path: Path) -> None:
    folder = write_trace(tmp_path / "t", {"e2e": [(ts(0), 1.0, "aa")]})
    lora = folder / SERIES["load_lora"][0]
    _tar(lora, {"lora.csv": b"time,value,container_ip\n1,2,aa\n"})
    with pytest.raises(
        TraceError, match=r"lora_update_latency_anon\.tar\.gz: lacks .*timestamp_anon"
    ):
        load_trace(folder)
    lora.write_bytes(b"not gzip")
    with pytest.raises(TraceError, match=r"lora_update_latency_anon\.tar\.gz: not a readable"):
        load_trace(folder)
    _tar(lora, {"a.csv": b"", "b.csv": b""})
    with pytest.raises(TraceError, match="holds 2 CSV members"):
        load_trace(folder)
    write_trace(folder, {"e2e": [(ts(0), 1.0, "aa"), (ts(1) + 5, 1.0, "aa")]})
    with pytest.raises(TraceError, match="off the 57 s grid"):
        load_trace(folder)


# ---- baselines --------------------------------------------------------------------------


def test_trailing_median_excludes_the_step_and_needs_min_count() -> None:
    x = np.array([[1.0], [3.0], [np.nan], [2.0], [100.0], [5.0]])
    med, mad = trailing_median_mad(x, window=3, min_count=2)
    assert np.isnan(med[:2, 0]).all()  # fewer than 2 values before
    assert (
        med[2, 0] == 2.0 and med[3, 0] == 2.0 and med[4, 0] == 2.5
    )  # (1, 3), (1, 3, nan), (3, nan, 2)
    assert med[5, 0] == 51.0  # window (nan, 2, 100)
    assert mad[5, 0] == 49.0
    assert column_median(np.array([[1.0, np.nan], [3.0, np.nan], [8.0, np.nan]])).tolist()[0] == 3.0


# ---- attribution on synthetic containers -----------------------------------------------


def _synthetic(n: int = 80, spike_at: int = 60) -> Trace:
    """Three containers, e2e ~10 s with a little noise and a 30 s spike at ``spike_at``;
    LoRA loads of ~4 s on every step.
    * ``slow``: the LoRA load of the step before the spike took 14 s (3.5x usual);
    * ``ordinary``: every load stays ordinary; the GPU duty cycle saturates instead;
    * ``queued``: ordinary loads, the gateway queue time rose by 15 s."""
    rng = np.random.default_rng(7)
    names = ("ordinary", "queued", "slow")
    e2e = 10_000 + rng.normal(0, 300, (n, 3))
    e2e[spike_at] = 30_000
    lora = 4_000 + rng.normal(0, 100, (n, 3))
    lora[spike_at - 1, 2] = 14_000
    duty = np.full((n, 3), 20.0)
    duty[spike_at, 0] = 98.0
    queue = np.full((n, 3), 200.0)
    queue[spike_at, 1] = 15_200.0
    empty = np.full((n, 3), np.nan)
    panels = {
        "e2e": e2e,
        "model_predict": empty,
        "queue_rt": queue,
        "qps": np.full((n, 3), 0.09),
        "duty_cycle": duty,
        "gpu_memory": np.full((n, 3), 2e10),
        "load_basemodel": empty,
        "load_lora": lora,
        "load_controlnet": 3_900 + rng.normal(0, 50, (n, 3)),
        "load_pipeline": empty,
    }
    return Trace(
        folder=Path("synthetic"),
        ts=T0 + STEP_S * np.arange(n, dtype=np.int64),
        containers=names,
        panels=panels,
        cluster={"queue_size": np.zeros(n), "api_qps": np.zeros(n)},
    )


def _by_container(t: Trace) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for i in diagnose(t).incidents:
        out.setdefault(i.container, []).append(i.to_dict())
    return out


def test_slow_load_before_a_spike_is_named_model_load_with_its_share() -> None:
    inc = _by_container(_synthetic())["slow"]
    assert len(inc) == 1
    causes = inc[0]["causes"]
    assert isinstance(causes, list)
    first = causes[0]
    assert (first["kind"], first["culprit"]) == ("model_load", "lora")
    # extra load ~10 s over an excess of ~20 s
    assert 0.4 <= first["share"] <= 0.6
    assert first["evidence"]["max_ratio"] >= 3.0
    assert causes[-1]["kind"] == "unknown"
    assert sum(c["share"] for c in causes) <= 1.0 + 1e-9
    assert inc[0]["start"] == iso(T0 + 60 * STEP_S)


def test_ordinary_loads_do_not_name_model_load() -> None:
    inc = _by_container(_synthetic())["ordinary"]
    assert len(inc) == 1
    causes = inc[0]["causes"]
    assert isinstance(causes, list)
    assert [c["kind"] for c in causes] == ["unknown"]
    assert causes[0]["evidence"]["duty_cycle_saturated"] is True


def test_queue_growth_is_the_containers_own_load() -> None:
    inc = _by_container(_synthetic())["queued"]
    causes = inc[0]["causes"]
    assert isinstance(causes, list)
    assert causes[0]["kind"] == "load" and causes[0]["culprit"] == "queued"
    assert causes[0]["share"] >= 0.7
    assert not any(c["kind"] == "model_load" for c in causes)


def test_summary_counts_incidents_and_shares_of_excess_on_synthetic() -> None:
    s = summarize(diagnose(_synthetic()))
    assert s["incidents"] == 3 and s["spikes"] == 3
    assert s["explained"]["model_load"]["incidents"] == 1
    assert s["explained"]["load"]["incidents"] == 1
    assert s["only_unknown"] == 1
    shares = sum(e["excess_share"] for e in s["explained"].values())
    assert shares == pytest.approx(1.0, abs=1e-3)


def test_bench_cli_scores_the_product_and_the_side_detector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows: dict[str, list[Row]] = {"e2e": [], "load_lora": []}
    for i in range(40):
        rows["e2e"].append((ts(i), 40_000.0 if i == 30 else 10_000.0 + (i % 3) * 100, "aa"))
        rows["load_lora"].append((ts(i), 24_000.0 if i == 29 else 4_000.0 + (i % 2) * 50, "aa"))
    folder = write_trace(tmp_path / "t", rows)
    out = tmp_path / "out.json"
    assert main(["bench", "--gentd26", str(folder), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["product"]["measures"]["halves"]["split_step"] == 20
    # the side detector finds the one spike (step 30, in the second half) and names the load
    side = doc["side"]["measures"]
    assert side["detection"]["spike_events"] == 1
    assert side["detection"]["recall"]["rate"] == 1.0
    assert side["detection"]["precision"]["rate"] == 1.0
    assert list(side["causes"]) == ["model_load:lora"]
    # the product's figures follow from the incidents it reported
    product = doc["product"]
    covers = any(
        i["container"] in ("aa", None) and i["start_s"] <= ts(30) <= i["end_s"]
        for i in product["incidents"]
    )
    assert product["measures"]["detection"]["recall"]["k"] == int(covers)
    assert product["diagnoses"] >= 1
    assert "recall of 1 unambiguous spike events" in printed
    assert main(["bench", "--gentd26", str(tmp_path / "absent")]) == 2


# ---- the published trace ----------------------------------------------------------------


@pytest.mark.skipif(not REAL.is_dir(), reason=f"the GenTD26 trace is not at {REAL}")
def test_real_trace_side_detector_incidents_are_well_formed() -> None:
    doc = bench(REAL)
    s = doc["summary"]
    assert s["trace"]["containers"] == 144 and s["trace"]["steps"] == 1441
    assert s["incidents"] >= 100
    for inc in doc["incidents"]:
        assert sum(c["share"] for c in inc["causes"]) <= 1.0 + 5e-4  # 4-decimal rounding
        kinds = [c["kind"] for c in inc["causes"]]
        assert "unknown" not in kinds[:-1]
    # any incident can be checked against the raw files: its start is a raw e2e row
    t = load_trace(REAL)
    inc = doc["incidents"][0]
    c = t.containers.index(inc["container"])
    step = [iso(x) for x in t.ts].index(inc["start"])
    assert np.isfinite(t.panels["e2e"][step, c])
