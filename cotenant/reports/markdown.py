"""The weekly report as Markdown: a summary short enough for a chat message or an email."""

from __future__ import annotations

from cotenant.reports.recommend import nothing_to_recommend
from cotenant.reports.summary import WeekSummary
from cotenant.reports.text import (
    ORDINARY_HEAD,
    ORDINARY_NOTE,
    SECTIONS,
    delta,
    headline,
    hours,
    loads_note,
    ms,
    num,
    ordinary_cells,
    pct,
    when,
)


def render_markdown(s: WeekSummary) -> str:
    """Every section of the report as Markdown (tables, links to the dashboard)."""
    title = dict(SECTIONS)
    out = [f"# Contention report {s.week}", "", f"{when(s.start_ns)} to {when(s.end_ns)}", ""]
    out += [f"## {title['summary']}", "", headline(s), ""]
    if s.models:
        out += [
            "| model | requests | SLO p99 | SLO attainment | incidents | impacted min |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for m in s.models:
            out.append(
                f"| {m.model} | {num(m.requests)} | {ms(m.slo_ms)} | {pct(m.slo_attainment)} "
                f"| {m.incidents} | {num(m.impacted_minutes)} |"
            )
        out.append("")
        llm = [m for m in s.models if m.ttft_slo_ms is not None or m.tpot_slo_ms is not None]
        if llm:
            out += [
                "Generative models (time to first token, time per output token):",
                "",
                "| model | TTFT SLO p99 | TTFT attainment | TPOT SLO p99 | TPOT attainment |",
                "|---|---:|---:|---:|---:|",
            ]
            for m in llm:
                tpot = "–" if m.tpot_slo_ms is None else f"{m.tpot_slo_ms:g} ms/token"
                out.append(
                    f"| {m.model} | {ms(m.ttft_slo_ms)} | {pct(m.ttft_attainment)} "
                    f"| {tpot} | {pct(m.tpot_attainment)} |"
                )
            out.append("")
    out += ["Week over week (all models):", ""]
    for c in s.changes:
        if c.scope == "all":
            this = pct(c.this_week) if c.metric == "slo_attainment" else num(c.this_week)
            last = pct(c.last_week) if c.metric == "slo_attainment" else num(c.last_week)
            out.append(f"- {c.metric.replace('_', ' ')}: {this} (last week {last}, {delta(c)})")
    out.append("")
    out += [f"## {title['who-hurt-whom']}", ""]
    if not s.culprits:
        out += ["No co-tenant, process or GPU caused an incident this week.", ""]
    else:
        out += [
            "| culprit | type | victim-minutes | victims | kinds |",
            "|---|---|---:|---|---|",
        ]
        for k in s.culprits:
            out.append(
                f"| {k.culprit} | {k.culprit_type} | {num(k.victim_minutes, 1)} "
                f"| {', '.join(k.victims)} | {', '.join(k.kinds)} |"
            )
        out.append("")
    if s.ordinary:
        out += [
            ORDINARY_NOTE,
            "",
            "| " + " | ".join(ORDINARY_HEAD) + " |",
            "|---|---|---:|---:|---|",
        ]
        out += ["| " + " | ".join(ordinary_cells(o)) + " |" for o in s.ordinary]
        out.append("")
    out += [f"## {title['causes']}", ""]
    if not s.causes:
        out += ["No incidents.", ""]
    else:
        out += ["| model | cause | impacted minutes |", "|---|---|---:|"]
        out += [f"| {c.model} | {c.kind} | {num(c.minutes, 1)} |" for c in s.causes]
        out += ["", "Worst incidents:", ""]
        for i in s.worst:
            top = f"{i.top_kind} by {i.top_culprit}" if i.top_kind else "cause unknown"
            out.append(
                f"- [{i.id}]({i.url}) {i.model} on {i.gpu}"
                + (f" (replica {i.replica})" if i.replica else "")
                + f", {when(i.start_ns)}, "
                f"{num(i.minutes)} min, p99 {ms(i.peak_p99_ms)} (baseline "
                f"{ms(i.baseline_p99_ms)}): {top}"
            )
        out.append("")
    out += [f"## {title['loads']}", "", loads_note(s), ""]
    if s.load_waits:
        out += [
            "| model | requests | waited for loads | share of latency | mean wait |",
            "|---|---:|---:|---:|---:|",
        ]
        for w in s.load_waits:
            share = "–" if w.latency_share is None else f"{w.latency_share * 100:.1f}%"
            out.append(
                f"| {w.model} | {num(w.requests)} | {hours(w.wait_h)} | {share} "
                f"| {ms(w.mean_wait_ms)} |"
            )
        out.append("")
    if s.load_kinds:
        out += [
            "| model | kind | loads | load time | mean | longest | replicas | most on |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for lk in s.load_kinds:
            out.append(
                f"| {lk.model} | {lk.kind} | {num(lk.loads)} | {hours(lk.load_h)} "
                f"| {ms(lk.mean_ms)} | {ms(lk.max_ms)} | {lk.replicas} | {lk.top_replica} |"
            )
        out += ["", "Replicas that spent the most time loading:", ""]
        for lr in s.load_replicas:
            split = ", ".join(f"{kind} {hours(v / 3.6e6)}" for kind, v in lr.by_kind_ms.items())
            out.append(
                f"- {lr.replica} ({lr.model}): {num(lr.loads)} loads, {hours(lr.load_h)} ({split})"
            )
        out.append("")
    out += [f"## {title['gpus']}", ""]
    if not s.gpus:
        out += ["No GPU counters this week.", ""]
    else:
        out += [
            "| GPU | SM sat. h | DRAM sat. h | PCIe sat. h | throttled h | memory full h "
            "| co-tenancy h | tenants |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for g in s.gpus:
            out.append(
                f"| {g.gpu} | {num(g.sm_saturated_h, 1)} | {num(g.dram_saturated_h, 1)} "
                f"| {num(g.pcie_saturated_h, 1)} | {num(g.throttled_h, 1)} "
                f"| {num(g.memory_full_h, 1)} | {num(g.cotenancy_h, 1)} "
                f"| {', '.join(g.models + g.processes)} |"
            )
        out.append("")
    a = s.action_counts
    out += [f"## {title['actions']}", ""]
    if not s.actions:
        out += ["No actions were proposed this week.", ""]
    else:
        out += [
            f"{a.proposed} proposed, {a.applied} applied, {a.held} held, "
            f"{a.rolled_back} rolled back, {a.failed} failed; "
            f"{a.held_back} held back by guardrails.",
            "",
            "| action | target | state | victim | p99 before | p99 after |",
            "|---|---|---|---|---:|---:|",
        ]
        for x in s.actions:
            out.append(
                f"| {x.kind} | {x.target} | {x.state} | {x.victim or '–'} "
                f"| {ms(x.p99_before_ms)} | {ms(x.p99_after_ms)} |"
            )
        out.append("")
    out += [f"## {title['recommendations']}", ""]
    if not s.recommendations:
        out += [nothing_to_recommend(s), ""]
    for r in s.recommendations:
        gain = r.evidence.get("expected_gain")
        out.append(f"- **{r.title}** — {r.because}." + (f" Expected gain: {gain}." if gain else ""))
    out.append("")
    return "\n".join(out)
