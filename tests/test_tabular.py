"""Tabular mode: loading and validating wide CSV cases, ranking entities, the CLI, the bench."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cotenant.analysis.change import SeriesShift
from cotenant.analysis.tabular import (
    Rules,
    front_door_latency,
    inherited_share,
    load_case,
    rank_entities,
    rca_table,
)
from cotenant.core.errors import CotenantError, TabularError
from cotenant.evaluation.tabular_cases import bench_tabular, render_tabular

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT.parent / "shared" / "data" / "tabular-dev"
T0 = 1_700_000_000
N, START = 16, 10  # rows, first anomalous row

# web -> cart -> db and web -> pay; cart and pay share a node, so do web and db
CALLS = {"web": ["cart", "pay"], "cart": ["db"], "pay": [], "db": []}
LATENCY_S = {"web": 0.40, "cart": 0.05, "pay": 0.03, "db": 0.01}
NODE = {"web": "n1", "db": "n1", "cart": "n2", "pay": "n2"}


def shop(
    fault: str | None = None,
    culprit: str = "db",
    *,
    seed: int = 0,
    node_storm: str | None = None,
) -> pd.DataFrame:
    """A small shop as a wide table: ``shop-svc`` is the end-to-end view; each service has
    cpu, mem, own latency, the latency of its calls and its node's cpu. ``fault`` from row
    ``START`` on: ``cpu`` (culprit's CPU and latency rise, callers slow down with it),
    ``slow`` (only the culprit's latency rises) or ``fail-fast`` (the culprit answers in a
    third of the time and the shop's success rate drops). ``node_storm``: that node's cpu
    (shared by two services) jumps, from something outside the table."""
    rng = np.random.default_rng(seed)
    after = np.arange(N) >= START

    def noisy(level: float, rel: float = 0.02) -> np.ndarray:
        return level * np.exp(rel * rng.standard_normal(N))

    # the p99 of a lightly used leaf (db) is noisier than that of the busy front
    own = {e: noisy(v, 0.5 if e == "db" else 0.02) for e, v in LATENCY_S.items()}
    cpu = {e: noisy(20.0, 0.05) for e in CALLS}
    if fault in ("cpu", "slow"):
        own[culprit] = own[culprit] + after * (0.3 if fault == "cpu" else 0.15)
    if fault == "cpu":
        cpu[culprit] = cpu[culprit] + after * 60.0
    if fault == "fail-fast":
        own[culprit] = np.where(after, own[culprit] / 3.0, own[culprit])

    total: dict[str, np.ndarray] = {}

    def latency(e: str) -> np.ndarray:  # own time plus the calls'
        if e not in total:
            total[e] = own[e] + sum((latency(c) for c in CALLS[e]), np.zeros(N))
        return total[e]

    node_cpu = {n: noisy(35.0, 0.03) for n in ("n1", "n2")}
    if node_storm:
        node_cpu[node_storm] = node_cpu[node_storm] + after * 50.0
    cols: dict[str, np.ndarray] = {"time": T0 + 60 * np.arange(N)}
    e2e = latency("web") * 1.02
    success = np.where(after & (fault == "fail-fast"), 70.0, 99.5) + rng.normal(0, 0.1, N)
    cols |= {"shop-svc_latency-p50": e2e / 2, "shop-svc_latency-p99": e2e}
    cols["shop-svc_success"] = success
    for e in CALLS:
        cols[f"{e}_cpu"] = cpu[e]
        cols[f"{e}_mem"] = noisy(300.0, 0.01)
        cols[f"{e}_latency-p99"] = latency(e)
        if CALLS[e]:
            cols[f"{e}_client-latency-p99"] = sum((latency(c) for c in CALLS[e]), np.zeros(N))
        cols[f"{e}_node-cpu"] = node_cpu[NODE[e]]
    return pd.DataFrame(cols)


def write_case(
    folder: Path, frame: pd.DataFrame, inject: str | None = None, label: str | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "data.csv", index=False)
    if inject is not None:
        (folder / "inject_time.txt").write_text(inject)
    if label is not None:
        (folder / "label.json").write_text(json.dumps({"root_cause": label, "fault": "x"}))
    return folder


INJECT = str(T0 + 60 * START)


# ------------------------------------------------------------------------------ ranking


@pytest.mark.parametrize("culprit", ["db", "cart", "pay", "web"])
@pytest.mark.parametrize("seed", [0, 1])
def test_cpu_contention_ranks_the_culprit_first_not_its_callers(
    tmp_path: Path, culprit: str, seed: int
) -> None:
    case = write_case(tmp_path, shop("cpu", culprit, seed=seed), INJECT)
    r = rca_table(case)
    assert r.ranks[0] == culprit
    assert "shop-svc" not in r.ranks and "shop-svc" not in r.scores  # the symptom, not a cause
    assert sorted(r.ranks) == ["cart", "db", "pay", "web"]
    assert r.start_from == "inject-time" and r.anomaly_start == T0 + 60 * START
    assert r.evidence[culprit].metric in (f"{culprit}_cpu", f"{culprit}_latency-p99")
    assert r.to_json() == {"ranks": r.ranks, "scores": r.scores}


def test_a_callers_latency_explained_by_its_calls_is_not_held_against_it(tmp_path: Path) -> None:
    case = load_case(write_case(tmp_path, shop("slow", "db"), INJECT))
    ranks, scores, evidence = rank_entities(case, START)
    assert ranks[0] == "db"
    # cart is slower by as much as db, all of it inside its calls to db
    cart = evidence.get("cart")
    assert cart is None or cart.metric != "cart_latency-p99" or cart.inherited > 0.9
    assert scores["cart"] < scores["db"] / 5
    _, naive, ev = rank_entities(case, START, Rules(inherit=False))
    assert ev["cart"].metric == "cart_latency-p99"  # without the rule: cart's latency...
    assert naive["cart"] > 10 * max(scores["cart"], 1.0)  # ...is strong evidence against it


def test_inherited_share_is_the_growth_the_calls_show_too() -> None:
    def ch(before: float, during: float) -> SeriesShift:
        return SeriesShift(before, during, during, 1.0, during - before)

    assert inherited_share(ch(0.1, 0.4), ch(0.05, 0.2)) == pytest.approx(1.0)  # 4x and 4x
    assert inherited_share(ch(0.1, 0.4), ch(0.05, 0.1)) == pytest.approx(0.5)  # 4x and 2x
    assert inherited_share(ch(0.1, 0.4), ch(0.05, 0.04)) == 0.0  # calls got faster
    assert inherited_share(ch(0.1, 0.4), None) == 0.0
    assert inherited_share(ch(0.1, 0.1), ch(0.05, 0.2)) == 0.0
    assert inherited_share(ch(0.0, 0.4), ch(0.05, 0.2)) == 0.0


def test_host_series_and_series_shared_by_entities_are_not_evidence(tmp_path: Path) -> None:
    # cart and pay share a node whose cpu storms and a volume whose IO jumps (something
    # outside the table); db is the one whose CPU rose, a little
    frame = shop("cpu", "db", node_storm="n2")
    frame["db_cpu"] = frame["db_cpu"].to_numpy()[0] * (1 + 0.05 * (np.arange(N) >= START))
    frame["cart_disk-io"] = frame["pay_disk-io"] = 1e6 * (1 + 9 * (np.arange(N) >= START))
    case = load_case(write_case(tmp_path, frame, INJECT))
    ranks, scores, evidence = rank_entities(case, START)
    assert ranks[0] == "db"
    assert not any(ev.metric.endswith(("node-cpu", "disk-io")) for ev in evidence.values())
    _, naive, ev = rank_entities(case, START, Rules(drop_shared=False))
    assert ev["cart"].metric == "cart_disk-io" and naive["cart"] > scores["db"]
    _, naive, ev = rank_entities(case, START, Rules(drop_shared=False, drop_context=False))
    assert ev["pay"].metric in ("pay_node-cpu", "pay_disk-io") and naive["pay"] > scores["db"]


def test_a_service_failing_fast_is_found_by_its_falling_latency(tmp_path: Path) -> None:
    case = load_case(write_case(tmp_path, shop("fail-fast", "pay"), INJECT))
    ranks, _, evidence = rank_entities(case, START)
    assert ranks[0] == "pay"
    assert evidence["pay"].during < evidence["pay"].before
    _, scores, _ = rank_entities(case, START)
    _, one_way, _ = rank_entities(case, START, Rules(latency_both_ways=False))
    assert one_way["pay"] < scores["pay"] / 10  # rises only: nothing stands out


def test_without_an_inject_time_the_start_is_a_change_point_of_the_end_to_end_latency(
    tmp_path: Path,
) -> None:
    case = write_case(tmp_path, shop("cpu", "cart"))
    r = rca_table(case)
    assert r.start_from == "change-point"
    assert r.anomaly_metric is not None and r.anomaly_metric.startswith("shop-svc_latency")
    assert abs(r.anomaly_start - (T0 + 60 * START)) <= 60
    assert r.ranks[0] == "cart"


def test_without_an_end_to_end_view_the_front_door_is_the_slowest_entity(tmp_path: Path) -> None:
    frame = shop("cpu", "db").drop(columns=[c for c in shop().columns if c.startswith("shop-svc")])
    case = load_case(write_case(tmp_path, frame))
    assert front_door_latency(case) == ["web_latency-p99"]
    r = rca_table(case)
    assert r.anomaly_metric == "web_latency-p99"
    assert r.ranks[0] == "db" and "web" in r.ranks


def test_a_bare_csv_and_an_inject_time_that_overrides_the_file(tmp_path: Path) -> None:
    folder = write_case(tmp_path / "c", shop("cpu", "pay"), inject=str(T0 + 60 * 4))
    assert load_case(folder).inject_time == T0 + 240
    assert load_case(folder / "data.csv").inject_time is None  # a bare CSV has no side file
    r = rca_table(folder, inject_time=T0 + 60 * START - 30)  # between rows: next row starts
    assert r.anomaly_start == T0 + 60 * START
    assert r.ranks[0] == "pay"


# --------------------------------------------------------------------------- validation


def _csv(tmp_path: Path, text: str, name: str = "data.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("t,a_cpu\n1,2\n", "no 'time' column"),
        ("time,a_cpu\nx,1\ny,2\n", "'time' column is neither numeric Unix seconds nor dates"),
        ("time,a_cpu\n,1\n,2\n", "'time' column has no finite value"),
        ("time,cpu\n1,1\n", "no <entity>_<metric> column"),
        ("time,a_\n1,1\n", "no <entity>_<metric> column"),
        ("time,a_cpu\n1,high\n2,low\n3,4\n", "no <entity>_<metric> column"),
        ("time\n1\n2\n", "no <entity>_<metric> column"),
    ],
)
def test_a_table_with_no_reading_is_refused_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _csv(tmp_path, text)
    with pytest.raises(TabularError) as err:
        load_case(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("text", "note", "time", "cpu"),
    [
        ("time,a_cpu\n2,1\n1,2\n", "sorted", [1, 2], [2, 1]),
        (
            "time,a_cpu\n1,1\n1,3\n2,5\n",
            "1 rows sharing a time merged",
            [1, 2],
            [2, 5],
        ),
        (
            "time,a_cpu,a_cpu,time\n1,1,9,1\n2,2,9,2\n",
            "column names repeat (a_cpu, time)",
            [1, 2],
            [1, 2],
        ),
        ("Unnamed: 0,time,a_cpu\n0,1,1\n1,2,2\n", "'Unnamed: 0'", [1, 2], [1, 2]),
        ("time,a_cpu\n1,1\n2,high\n3,3\n", "1 cells are not numbers", [1, 2, 3], [1, None, 3]),
        ("time,a_cpu\n1,1\n,2\n3,3\n", "1 rows without a time dropped", [1, 3], [1, 3]),
        (
            "timestamp,a_cpu\n1000,1\n2000,2\n",
            "the time column is 'timestamp'",
            [1000, 2000],
            [1, 2],
        ),
        (
            "time,a_cpu\n1700000000000,1\n1700000060000,2\n",
            "milliseconds",
            [1.7e9, 1.7e9 + 60],
            [1, 2],
        ),
        (
            "time,a_cpu\n2023-11-14T22:13:20Z,1\n2023-11-14T22:14:20Z,2\n",
            "dates",
            [1.7e9, 1.7e9 + 60],
            [1, 2],
        ),
    ],
)
def test_a_table_with_one_reading_is_read_so_and_says_how(
    tmp_path: Path, text: str, note: str, time: list[float], cpu: list[float | None]
) -> None:
    case = load_case(_csv(tmp_path, text))
    assert any(note in n for n in case.notes), case.notes
    assert case.time.tolist() == pytest.approx(time)
    got = [None if np.isnan(x) else x for x in case.series["a_cpu"]]
    assert got == cpu


def test_a_repeated_time_column_and_a_millisecond_inject_time_still_rank(tmp_path: Path) -> None:
    frame = shop("cpu", "db")
    frame.insert(len(frame.columns), "time.1", frame["time"])  # as pandas writes a repeat
    text = frame.to_csv(index=False).replace("time.1", "time", 1)
    folder = tmp_path / "case"
    folder.mkdir()
    (folder / "data.csv").write_text(text)
    (folder / "inject_time.txt").write_text(str(int(INJECT) * 1000))
    r = rca_table(folder)
    assert r.ranks[0] == "db" and r.anomaly_start == T0 + 60 * START
    assert any("repeat" in n for n in r.notes) and any("inject time" in n for n in r.notes)


def test_missing_case_and_folder_without_data(tmp_path: Path) -> None:
    with pytest.raises(TabularError, match="no such case folder or CSV file"):
        load_case(tmp_path / "nope")
    with pytest.raises(TabularError, match=r"no data\.csv in this case folder"):
        load_case(tmp_path)
    _csv(tmp_path, "\xff\xfe", name="x.csv").write_bytes(b"time,a_cpu\n\xff\xfe,1\n")
    with pytest.raises(TabularError, match="cannot be read as CSV"):
        load_case(tmp_path / "x.csv")


def test_a_bad_inject_time_file_is_refused(tmp_path: Path) -> None:
    write_case(tmp_path, shop(), inject="yesterday")
    with pytest.raises(TabularError, match=r"inject_time\.txt: 'yesterday' is neither a Unix"):
        load_case(tmp_path)


def test_an_inject_time_given_as_a_date_is_read_as_utc(tmp_path: Path) -> None:
    write_case(tmp_path, shop("cpu"), inject="2023-11-14 22:23:20")  # T0 + 600 s, no zone
    r = rca_table(tmp_path)
    assert r.start_from == "inject-time" and r.anomaly_start == T0 + 60 * START
    assert r.ranks[0] == "db"


@pytest.mark.parametrize(("row", "before", "after"), [(2, 2, 14), (15, 15, 1)])
def test_an_inject_time_with_few_rows_on_a_side_is_answered_roughly(
    tmp_path: Path, row: int, before: int, after: int
) -> None:
    write_case(tmp_path, shop("cpu"), inject=str(T0 + 60 * row))
    r = rca_table(tmp_path)
    assert len(r.ranks) == 4
    assert f"only {before} rows before the anomaly and {after} from it on" in r.notes[-1]


def test_an_inject_time_in_the_last_rows_window_is_the_last_row(tmp_path: Path) -> None:
    # rows stamped at the start of their minute: a fault 30 s into the last one is in it
    write_case(tmp_path, shop("cpu"), inject=str(T0 + 60 * (N - 1) + 30))
    r = rca_table(tmp_path)
    assert r.start_from == "inject-time" and r.anomaly_start == T0 + 60 * (N - 1)
    assert any("falls in the last row's window" in n for n in r.notes)


@pytest.mark.parametrize(("row", "before", "after"), [(-5, 0, 16), (99, 16, 0)])
def test_an_inject_time_outside_the_table_is_said_and_the_start_found_without_it(
    tmp_path: Path, row: int, before: int, after: int
) -> None:
    # a clock or zone mix-up: the case is still answered, and the reader told why
    write_case(tmp_path, shop("cpu"), inject=str(T0 + 60 * row))
    r = rca_table(tmp_path)
    assert r.start_from == "change-point" and abs(r.anomaly_start - (T0 + 60 * START)) <= 60
    assert r.ranks[0] == "db"
    said = [n for n in r.notes if f"leaves {before} rows before and {after} from it on" in n]
    assert said and "the start was found without it, a change point in shop-svc_" in said[0]


def test_without_a_change_point_the_largest_rise_answers_and_says_it_is_weak(
    tmp_path: Path,
) -> None:
    write_case(tmp_path / "flat", shop(None))
    r = rca_table(tmp_path / "flat")
    assert r.start_from == "largest-rise" and r.anomaly_metric is not None
    assert len(r.ranks) == 4
    assert any("no change point upward in shop-svc_latency" in n and "weak" in n for n in r.notes)
    # one slow row is no change point (it does not last), but it is where the start is put
    bumped = shop(None)
    bumped.loc[12, "shop-svc_latency-p99"] *= 1.5
    write_case(tmp_path / "bump", bumped)
    r = rca_table(tmp_path / "bump")
    assert r.start_from == "largest-rise" and r.anomaly_metric == "shop-svc_latency-p99"
    assert r.anomaly_start == T0 + 60 * 12
    rose = "shop-svc_latency-p99 rose most over the median before it (1.4"
    assert any(rose in n for n in r.notes)


def test_no_latency_no_candidate_and_no_rows_are_refused(tmp_path: Path) -> None:
    no_latency = shop("cpu")[["time", "db_cpu", "web_cpu"]]
    write_case(tmp_path / "nolat", no_latency)
    with pytest.raises(TabularError, match="no latency column to find the anomaly on"):
        rca_table(tmp_path / "nolat")
    assert rca_table(tmp_path / "nolat", inject_time=T0 + 60 * START).ranks[0] == "db"
    with pytest.raises(TabularError, match="leaves 16 rows before and 0 from it on; no latency"):
        rca_table(tmp_path / "nolat", inject_time=T0 + 60 * 99)
    only_view = shop("cpu")[["time", "shop-svc_latency-p99", "shop-svc_success"]]
    write_case(tmp_path / "view", only_view, INJECT)
    with pytest.raises(TabularError, match="every entity is an end-to-end view"):
        rca_table(tmp_path / "view")
    write_case(tmp_path / "one", shop("cpu").iloc[:1])
    with pytest.raises(TabularError, match="a single row: need at least one before"):
        rca_table(tmp_path / "one")
    assert issubclass(TabularError, CotenantError)


# ---------------------------------------------------------------------------------- CLI


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cotenant", "rca-table", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_json_prints_ranks_and_scores(tmp_path: Path) -> None:
    write_case(tmp_path, shop("cpu", "cart"), INJECT)
    out = cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"ranks", "scores"}
    assert doc["ranks"][0] == "cart"
    assert set(doc["scores"]) == set(doc["ranks"]) == {"web", "cart", "pay", "db"}
    assert doc["scores"]["cart"] == max(doc["scores"].values())


def test_cli_table_and_inject_time_option(tmp_path: Path) -> None:
    write_case(tmp_path, shop("cpu", "db"))
    out = cli(str(tmp_path / "data.csv"), "--inject-time", "2023-11-14T22:23:20Z")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "anomaly from 2023-11-14T22:23:20Z (inject time)"
    assert lines[2].split()[:2] == ["1", "db"]
    assert "db_" in lines[2]


def test_cli_errors_name_the_file_and_exit_2(tmp_path: Path) -> None:
    _csv(tmp_path, "t,a_cpu\n1,2\n")
    out = cli(str(tmp_path / "data.csv"), "--json")
    assert out.returncode == 2
    assert out.stdout == ""
    assert "no 'time' column" in out.stderr and str(tmp_path / "data.csv") in out.stderr
    bad = cli(str(tmp_path), "--inject-time", "soon")
    assert bad.returncode == 2 and "--inject-time 'soon' is not a time" in bad.stderr


# -------------------------------------------------------------------------------- bench


def test_bench_scores_every_labelled_case_side_by_side(tmp_path: Path) -> None:
    for i, culprit in enumerate(["db", "cart", "pay"]):
        write_case(tmp_path / f"c{i}", shop("cpu", culprit, seed=i), INJECT, label=culprit)
    write_case(tmp_path / "unlabelled", shop("cpu"), INJECT)
    res = bench_tabular(tmp_path)
    assert res["methods"] == ["cotenant", "baro", "nsigma"]
    assert [c["case"] for c in res["cases"]] == ["c0", "c1", "c2"]
    ours = res["summary"]["cotenant"]
    assert {k: ours[k] for k in ("n", "AC@1", "AC@3", "AC@5", "Avg@5")} == {
        "n": 3,
        "AC@1": 1.0,
        "AC@3": 1.0,
        "AC@5": 1.0,
        "Avg@5": 1.0,
    }
    assert ours["AC@1_ci"][1] == 1.0 and 0.3 < ours["AC@1_ci"][0] < 0.5  # Wilson, n = 3
    assert [c["half"] for c in res["cases"]] == ["dev", "test", "dev"]
    assert (
        res["halves"]["dev"]["cotenant"]["n"] == 2 and res["halves"]["test"]["cotenant"]["n"] == 1
    )
    for m in ("baro", "nsigma"):
        assert {"AC@1", "AC@3", "AC@5", "Avg@5"} <= set(res["summary"][m])
        assert all(c["ranks"][m] is not None for c in res["cases"])
    text = render_tabular(res)
    assert "cotenant: AC@1 1.000" in text and "baro: AC@1" in text
    assert "dev (n = 2):" in text and "test (n = 1):" in text
    json.dumps(res)  # JSON-ready as it is


def test_bench_with_detected_starts_counts_a_case_without_one_as_a_miss(tmp_path: Path) -> None:
    write_case(tmp_path / "a", shop("cpu", "db"), INJECT, label="db")
    write_case(tmp_path / "b", shop(None), INJECT, label="db")  # nothing happens
    write_case(tmp_path / "c", shop("cpu")[["time", "db_cpu", "web_cpu"]], INJECT, label="db")
    res = bench_tabular(tmp_path, detect_start=True)
    assert res["start"] == "change-point"
    a, b, c = res["cases"]
    assert a["ranks"]["cotenant"] == 1 and a["start_from"] == "change-point"
    assert b["start_from"] == "largest-rise"  # answered, weakly: nothing happened
    assert any("weak" in n for n in b["notes"])
    assert c["ranks"] == {"cotenant": None, "baro": None, "nsigma": None}
    assert c["start_from"].startswith("none (") and "no latency column" in c["start_from"]


def test_bench_counts_a_case_it_cannot_read_as_a_miss_and_goes_on(tmp_path: Path) -> None:
    write_case(tmp_path / "a", shop("cpu", "db"), INJECT, label="db")
    write_case(tmp_path / "b", shop("cpu", "db"), INJECT, label="db")
    (tmp_path / "b" / "data.csv").write_text("t,a_cpu\n1,2\n")  # no time column
    a, b = bench_tabular(tmp_path)["cases"]
    assert a["ranks"]["cotenant"] == 1
    assert b["ranks"]["cotenant"] is None and "no 'time' column" in b["start_from"]


def test_bench_refuses_a_folder_without_cases_or_with_a_bad_label(tmp_path: Path) -> None:
    with pytest.raises(TabularError, match="no case folders"):
        bench_tabular(tmp_path)
    write_case(tmp_path / "a", shop("cpu"), INJECT)
    (tmp_path / "a" / "label.json").write_text('{"culprit": "db"}')
    with pytest.raises(TabularError, match=r'needs \{"root_cause"'):
        bench_tabular(tmp_path)


@pytest.mark.skipif(not DEV.is_dir(), reason=f"tabular-dev cases not found at {DEV}")
def test_on_the_nezha_dev_cases_cotenant_is_at_least_as_accurate_as_baro() -> None:
    res = bench_tabular(DEV)
    assert len(res["cases"]) == 24
    ours, baro = res["summary"]["cotenant"], res["summary"]["baro"]
    assert ours["AC@1"] >= baro["AC@1"]
    assert ours["AC@3"] >= baro["AC@3"]
