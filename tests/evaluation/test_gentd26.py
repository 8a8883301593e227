"""evaluation/gentd26: the Alibaba GenTD26 loader, its trailing medians, the product's
attribution of the trace's spike events, and ``cotenant bench --gentd26``."""

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
from cotenant.evaluation.gentd26 import SERIES, STEP_S, Trace, iso, load_trace
from cotenant.evaluation.gentd26_attribution import StepWindows, bench, spike_events
from cotenant.evaluation.gentd26_measures import split_step
from cotenant.evaluation.gentd26_steps import (
    UNKNOWN,
    MeasureParams,
    Panels,
    TraceIncident,
    trailing_median,
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
    med = trailing_median(x, window=3, min_count=2)
    assert np.isnan(med[:2, 0]).all()  # fewer than 2 values before
    # windows (1, 3), (1, 3, nan), (3, nan, 2), (nan, 2, 100)
    assert med[2:, 0].tolist() == [2.0, 2.0, 2.5, 51.0]
    assert iso(T0) == "2022-09-11T01:12:00Z"


# ---- attribution on synthetic containers -----------------------------------------------


def _synthetic(n: int = 80, spike_at: int = 60) -> Trace:
    """Three containers, e2e ~10 s with a little noise and a 30 s spike at ``spike_at``;
    LoRA loads of ~4 s on every step.
    * ``slow``: the LoRA load of the spike's step took 14 s (3.5x usual; the import charges a
      step's loads to its own e2e row);
    * ``ordinary``: every load stays ordinary; the GPU duty cycle saturates instead;
    * ``queued``: ordinary loads, the gateway queue time rose by 15 s."""
    rng = np.random.default_rng(7)
    names = ("ordinary", "queued", "slow")
    e2e = 10_000 + rng.normal(0, 300, (n, 3))
    e2e[spike_at] = 30_000
    lora = 4_000 + rng.normal(0, 100, (n, 3))
    lora[spike_at, 2] = 14_000
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


def _attributed(t: Trace) -> dict[str, TraceIncident]:
    """The product's attribution of each container's spike event (the one spike step)."""
    panels = Panels.of(t, MeasureParams())
    view = StepWindows(t, panels)
    out = {}
    for c, a, b in spike_events(panels, range(len(t.containers)), 0):
        inc = view.attribute(c, a, b)
        assert inc is not None and inc.container is not None
        out[inc.container] = inc
    return out


def test_each_spike_event_is_attributed_by_the_product_from_its_own_start() -> None:
    got = _attributed(_synthetic())
    assert sorted(got) == ["ordinary", "queued", "slow"]
    for inc in got.values():
        assert inc.start_s == inc.end_s == T0 + 60 * STEP_S
        assert sum(c.share for c in inc.causes) <= 1.0 + 1e-9
        assert UNKNOWN not in [c.kind for c in inc.causes][:-1]


def test_a_slow_load_in_a_spike_is_named_model_load_with_its_share() -> None:
    causes = _attributed(_synthetic())["slow"].causes
    load = [c for c in causes if c.kind == "model_load"]
    # the extra load (~10 s) over an excess of ~20 s; the rest is compute time
    assert len(load) == 1 and 0.4 <= load[0].share <= 0.6


def test_ordinary_loads_do_not_name_model_load() -> None:
    for name in ("ordinary", "queued"):
        assert not [c for c in _attributed(_synthetic())[name].causes if c.kind == "model_load"]


def test_queue_growth_is_not_blamed_on_a_co_tenant_or_a_load() -> None:
    kinds = {c.kind for c in _attributed(_synthetic())["queued"].causes}
    assert not kinds & {"cotenant", "model_load"}


def test_bench_cli_scores_the_product_per_pool(
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
    assert "side" not in doc
    m = doc["product"]["measures"]
    assert m["halves"]["split_step"] == 20
    assert m["detection"]["spike_events"] == 1  # step 30, in the second half
    # the product's figures follow from the incidents it reported
    product = doc["product"]
    covers = any(
        i["container"] in ("aa", None) and i["start_s"] <= ts(30) <= i["end_s"]
        for i in product["incidents"]
    )
    assert m["detection"]["recall"]["k"] == int(covers)
    assert product["diagnoses"] >= 1
    # one pool (aa reports no ControlNet load): its figures are the whole trace's
    assert list(m["pools"]) == ["sd-pool-a"]
    pool = m["pools"]["sd-pool-a"]
    assert pool["detection"] == m["detection"]
    # the spike step's window holds a slow LoRA load: not an evidence-free spike
    assert pool["spike_steps"]["judged"]["k"] == 1
    assert pool["spike_steps"]["no_evidence"]["k"] == 0
    assert "recall of 1 unambiguous spike events" in printed
    assert "sd-pool-a (1 containers)" in printed
    assert main(["bench", "--gentd26", str(tmp_path / "absent")]) == 2


# ---- the published trace ----------------------------------------------------------------


@pytest.mark.skipif(not REAL.is_dir(), reason=f"the GenTD26 trace is not at {REAL}")
def test_real_trace_spike_events_are_attributed_and_scored_on_the_second_half() -> None:
    doc = bench(REAL)
    assert doc["steps"] == 1441
    assert doc["spike_events"] >= 100
    assert doc["events"] == doc["spike_events"] - doc["without_ordinary_steps_before"]
    assert sum(p["events"] for p in doc["pools"].values()) == doc["events"]
    lo, hi = doc["explained"]["unexplained_ci90"]
    assert 0.0 <= lo <= doc["explained"]["unexplained_share"] <= hi <= 1.0
    for key, c in doc["causes"].items():
        assert c["untestable"] or c["base_rate_first_half"] is not None, key
    t = load_trace(REAL)
    assert split_step(t) == doc["split_step"]
