"""Turn a results mapping into the target check, the far-from-floor notes, the plot and the README table."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

GiB = 1 << 30
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# The stages of SPEC sections 3-6, the ones issue 14's targets time (might_stall and the forecasts are 7 and 8).
STAGES = ("prepare", "horde", "eligibility", "competition", "figures")
LATER_STAGES = ("stall", "forecasts")
# A stage this many times the whole one-pass floor is called out as far from it.
FAR_FACTOR = 5.0


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def fit_exponent(x: list[float], y: list[float]) -> dict[str, float] | None:
    """Slope of log(y) on log(x): over all points, over the upper half of them, and between the last two."""
    pts = [(a, b) for a, b in zip(x, y) if a and b and b > 0 and np.isfinite(b)]
    if len(pts) < 2:
        return None
    lx, ly = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    slope = float(np.polyfit(lx, ly, 1)[0])
    last = float((ly[-1] - ly[-2]) / (lx[-1] - lx[-2]))
    # Fixed costs flatten the small end; the upper half says how the cost grows where it matters.
    half = len(pts) // 2
    upper = float(np.polyfit(lx[half:], ly[half:], 1)[0]) if len(pts) - half >= 2 else last
    return {"exponent": slope, "upper_half_exponent": upper, "last_step_exponent": last, "points": len(pts)}


def spec_3_6(point: dict[str, Any]) -> float | None:
    """A measured point's SPEC 3-6 seconds (median over runs; older results: the sum of the stage medians)."""
    batch = point.get("batch") or {}
    if "spec_3_6_s" in batch:
        return float(batch["spec_3_6_s"])
    stages = batch.get("stages_s") or {}
    return float(sum(stages[s] for s in STAGES)) if all(s in stages for s in STAGES) else None


def series(points: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """The plotted/fitted quantities of a sweep, one list per quantity."""
    def get(p: dict[str, Any], *path: str) -> float | None:
        for key in path:
            if not isinstance(p, dict) or key not in p:
                return None
            p = p[key]
        return float(p)

    out: dict[str, list[float | None]] = {
        "batch": [get(p, "batch", "total_s") for p in points],
        "spec_3_6": [spec_3_6(p) for p in points],
        "floor": [get(p, "floor", "total") for p in points],
        "dense": [get(p, "dense", "total_s") for p in points],
        "per_request_path": [get(p, "per_request", "scaled_to_queue_s") for p in points],
    }
    stages = sorted({s for p in points for s in p.get("batch", {}).get("stages_s", {})})
    for stage in stages:
        out[f"stage:{stage}"] = [get(p, "batch", "stages_s", stage) for p in points]
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 14's targets, each with the measured value and whether it was met (None: not measured)."""
    sizes = results.get("sizes", {})
    ten, stress = sizes.get("10x", {}), sizes.get("stress", {})
    out = []

    def add(name: str, value: Any, goal: str, met: bool | None) -> None:
        out.append({"target": name, "measured": value, "goal": goal, "met": met})


    if stress:
        t = spec_3_6(stress)
        cold = stress.get("batch_cold_stages_s") or {}
        if t is None and all(s in cold for s in STAGES):
            t = sum(cold[s] for s in STAGES)
            add("20,000 x 1,000,000: SPEC 3-6 estimate (cold run; the counted runs did not end)", t, "< 10 s", t < 10)
        elif t is None and "stopped" in stress:
            add("20,000 x 1,000,000: SPEC 3-6 estimate", stress["stopped"], "< 10 s", False)
        else:
            add("20,000 x 1,000,000: SPEC 3-6 estimate", t, "< 10 s", None if t is None else t < 10)
        m = stress.get("peak_rss_bytes") or stress.get("sampled_peak_rss_bytes")
        add("20,000 x 1,000,000: peak RSS (horde + whole estimate)", m, "< 4 GiB", None if not m else m < 4 * GiB)
    floor = _get(ten, "floor", "total")
    spec = spec_3_6(ten) if ten else None
    f = spec / floor if spec is not None and floor else None
    add("2,000 x 50,000: SPEC 3-6 estimate / one-pass floor", f, "<= 10x", None if f is None else f <= 10)
    stall_s = _get(ten, "batch", "stages_s", "stall")
    if ten.get("history") and stall_s is not None and spec:  # issue 11, item 6
        share = stall_s / spec
        add("2,000 x 50,000 with five minutes of history: might_stall / SPEC 3-6 (a share)", share, "<= 0.3",
            share <= 0.3)
    for stage in ("eligibility", "competition"):
        t = _get(ten, "batch", "stages_s", stage)
        ratio = t / floor if t is not None and floor else None
        add(f"2,000 x 50,000: {stage} / one-pass floor", ratio, "<= 4x", None if ratio is None else ratio <= 4)
    svc = results.get("service") or {}
    # A production cycle always has the last five minutes' pops and returns; might_stall's cost follows them.
    where = "PostgreSQL + Redis" + (", five minutes of history" if svc.get("history") else ", no history")
    for key, label, goal in (
        ("cycle_spec_3_6_s", "load + SPEC 3-6 estimate + publish", 0.5),
        ("cycle_s", "the same with might_stall and the forecasts", 1.0),
    ):
        total = svc.get(key)
        add(f"2,000 x 50,000 on {where}: {label}", total, f"< {goal:g} s",
            None if total is None else total < goal)
    pub = _get(results, "publish", "publish_s", "bucketed")
    add("publishing 300,000 requests to Redis", pub, "< 0.25 s", None if pub is None else pub < 0.25)
    for kind, goal, label in (
        ("requests", 1.05, "SPEC 3-6 growth in waiting requests at fixed workers, realistic horde (upper-half exponent)"),
        ("workers", 1.0, "SPEC 3-6 growth in workers at fixed requests, realistic horde (upper-half exponent)"),
        ("requests-adversarial", 1.05, "SPEC 3-6 growth in waiting requests, adversarial horde (upper-half exponent)"),
    ):
        sweep = _get(results, "sweeps", kind)
        e = None
        if sweep:
            fit = fit_exponent(sweep["x"], series(sweep["points"])["spec_3_6"])
            e = fit and fit["upper_half_exponent"]
        sign = "<=" if kind != "workers" else "<"
        add(label, e, f"{sign} {goal}", None if e is None else (e <= goal if kind != "workers" else e < goal))
    return out


def far_from_floor(results: dict[str, Any]) -> list[str]:
    """Plain-language notes on where the batch is far from the floor or grows faster than linearly."""
    notes = []
    for name, r in results.get("sizes", {}).items():
        floor = _get(r, "floor", "total")
        stages = _get(r, "batch", "stages_s") or {}
        if not floor:
            if "stopped" in r:
                cold = r.get("batch_cold_stages_s") or {}
                detail = ", ".join(f"{k} {v:.3g} s" for k, v in cold.items())
                notes.append(f"{name}: {r['stopped']}" + (f"; its cold run took {r['batch_cold_s']:.3g} s ({detail})" if cold else ""))
            continue
        for stage in STAGES:
            if stage in stages and stages[stage] > FAR_FACTOR * floor:
                share = stages[stage] / r["batch"]["total_s"]
                notes.append(
                    f"{name} ({r['workers']:,} x {r['requests']:,}): stage {stage} takes {stages[stage]:.3g} s, "
                    f"{stages[stage] / floor:.0f}x the whole one-pass floor ({share:.0%} of the batch)"
                )

    for kind, sweep in results.get("sweeps", {}).items():
        for key, ys in series(sweep["points"]).items():
            fit = fit_exponent(sweep["x"], ys)
            # Stages too small to matter (under 50 ms everywhere) are left out.
            if key.startswith("stage:") and fit and fit["upper_half_exponent"] > 1.15 and max(v or 0 for v in ys) > 0.05:
                notes.append(
                    f"sweep over {kind}: stage {key[6:]} grows as {kind}^{fit['upper_half_exponent']:.2f} "
                    f"over the upper half of the sweep (last step ^{fit['last_step_exponent']:.2f})"
                )
    return notes


# ---------------------------------------------------------------------------------
# Plot
# ---------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> None:
    """Time against queue size (left) and worker count (right), vecsched and the baselines, log-log."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    fig, axes = plt.subplots(1, 2, figsize=(13, 6.5))
    styles = {
        "batch": ("whole estimate (with stall, forecasts)", "o-", "C0"),
        "spec_3_6": ("SPEC 3-6 stages", "D-", "C5"),
        "floor": ("one-pass floor", "s--", "C2"),
        "dense": ("dense NumPy", "^-", "C1"),
        "per_request_path": ("per-request path (scaled)", "v:", "C3"),
    }
    for ax, kind in zip(axes, ("requests", "workers")):
        sweep = _get(results, "sweeps", kind)
        if not sweep:
            ax.set_visible(False)
            continue
        data = series(sweep["points"])
        for key, (label, style, color) in styles.items():
            pts = [(x, y) for x, y in zip(sweep["x"], data[key]) if x and y]
            if pts:
                fit = fit_exponent(sweep["x"], data[key])
                tail = f" (~{kind}^{fit['exponent']:.2f})" if fit else ""
                ax.plot(*zip(*pts), style, color=color, label=label + tail)
        adversarial = _get(results, "sweeps", "requests-adversarial")
        if kind == "requests" and adversarial:
            pts = [(x, y) for x, y in zip(adversarial["x"], series(adversarial["points"])["spec_3_6"]) if x and y]
            fit = fit_exponent(adversarial["x"], series(adversarial["points"])["spec_3_6"])
            tail = f" (~requests^{fit['exponent']:.2f})" if fit else ""
            if pts:
                ax.plot(*zip(*pts), "D-.", color="C4", label="SPEC 3-6, adversarial horde" + tail)
        if kind == "requests":
            for name, r in results.get("sizes", {}).items():
                t = _get(r, "batch", "total_s") or r.get("batch_cold_s")
                if t and r.get("waiting"):
                    cold = "" if _get(r, "batch", "total_s") else ", cold run"
                    ax.plot([r["waiting"]], [t], "*", color="k", ms=10)
                    ax.annotate(f"{name} ({r['workers']:,} w{cold})", (r["waiting"], t),
                                textcoords="offset points", xytext=(-6, 6), ha="right", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        fixed = ", ".join(f"{k} = {v:,}" for k, v in sweep["fixed"].items())
        ax.set_xlabel("waiting requests" if kind == "requests" else "workers")
        ax.set_ylabel("seconds for every waiting request")
        ax.set_title(f"over {kind} ({fixed})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    m = results.get("machine", {})
    fig.suptitle(f"vecsched benchmarks ({results['mode']} mode, {m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------
# README table
# ---------------------------------------------------------------------------------


def _s(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, (int, float)):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}x" if v >= 100 else f"{v:.3g}x"


def _gib(v: Any) -> str:
    return "-" if not v else f"{v / GiB:.2f} GiB"


def tables(results: dict[str, Any]) -> str:
    """The generated Markdown: machine, targets, per-size stages, side by side, sweeps, notes."""
    m = results["machine"]
    lines = [
        f"Generated by `{results['command']}` ({results['mode']} mode) on {results['started']}, "
        f"{results['elapsed_s']:.0f} s; vecsched at commit `{m.get('git_commit', '?')}`"
        + (" (with uncommitted changes under vecsched/)" if m.get("vecsched_dirty") else "") + ".",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs, {_gib(m.get('memory_bytes'))} RAM, "
        f"{m.get('platform', '?')}; Python {m.get('python')}, NumPy {m.get('numpy')}, pandas {m.get('pandas')}; "
        + ", ".join(f"{k}={v if v is not None else 'unset'}" for k, v in m.get("env", {}).items())
        + f"; load average {', '.join(f'{x:.2f}' for x in m.get('load_average', []))} at the start, "
        f"{', '.join(f'{x:.2f}' for x in m.get('load_average_end', []))} at the end (shared machine).",
        "",
        "### Targets",
        "",
        "| target | goal | measured | met |",
        "|---|---|---|---|",
    ]
    for t in results.get("targets", []):
        v = t["measured"]
        if v is None:
            v = "not measured"
        elif isinstance(v, (int, float)) and "RSS" in t["target"]:
            v = _gib(v)
        elif isinstance(v, (int, float)) and "speed-up" in t["target"]:
            v = _x(v)
        elif isinstance(v, (int, float)) and "floor" in t["target"]:
            v = _x(v)
        elif isinstance(v, (int, float)) and ("exponent" in t["target"] or "a share" in t["target"]):
            v = f"{v:.2f}"
        elif isinstance(v, (int, float)):
            v = f"{v:.3g} s"
        lines.append(f"| {t['target']} | {t['goal']} | {v} | {'-' if t['met'] is None else 'yes' if t['met'] else '**no**'} |")

    sizes = results.get("sizes", {})
    lines += [
        "",
        "### Per size: stages of `vecsched.estimate` (median seconds), memory and groups",
        "",
        "| size | workers x requests (waiting) | " + " | ".join(STAGES) + " | **SPEC 3-6** | "
        + " | ".join(LATER_STAGES) + " | whole estimate | cold | peak RSS | tracemalloc peak | request groups (text/image) "
        "| worker declarations | competition classes | signatures |",
        "|---|---|" + "---|" * (len(STAGES) + len(LATER_STAGES) + 9),
    ]

    for name, r in sizes.items():
        st = _get(r, "batch", "stages_s") or r.get("batch_cold_stages_s") or {}
        g = r.get("groups", {})
        label = f"{name}, with history" if r.get("history") else name
        lines.append(
            f"| {label} | {r['workers']:,} x {r['requests']:,} ({_s(r.get('waiting'))}) | "
            + " | ".join(_s(st.get(s)) for s in STAGES)
            + f" | **{_s(spec_3_6(r))}** | " + " | ".join(_s(st.get(s)) for s in LATER_STAGES)
            + f" | {_s(_get(r, 'batch', 'total_s'))} | {_s(r.get('batch_cold_s'))} | "
            f"{_gib(r.get('peak_rss_bytes') or r.get('sampled_peak_rss_bytes'))} | {_gib(r.get('tracemalloc_peak_bytes'))} | "
            f"{_s(g.get('text_request_groups'))}+{_s(g.get('text_special_groups'))} / "
            f"{_s(g.get('image_request_groups'))}+{_s(g.get('image_special_groups'))} | "
            f"{_s(g.get('text_worker_declarations'))} / {_s(g.get('image_worker_declarations'))} | "
            f"{_s(g.get('text_competition_classes'))} | {_s(g.get('text_signatures'))} |"
            + (f" {r['stopped']}" if "stopped" in r else "")
        )
    lines += [
        "",
        "Request groups are ordinary + special (special: targeted, owner of a worker in maintenance, or in an "
        "excluded pair). Peak RSS is the whole measuring process after the batch runs (interpreter, synthetic "
        "horde and estimate), before any baseline runs; the horde alone is in the JSON (`rss_after_synthesis_bytes`). "
        "A size \"with history\" carries five minutes of dispatches and returns (`vecsched.synthetic_history`), as "
        "the job's cycle does: might_stall's stage reads them, SPEC 3-6 does not.",
        "",
        "### Side by side (same process, same snapshot)",
        "",
        "| size | whole estimate (median of all runs) | one-pass floor | whole estimate / floor | SPEC 3-6 / floor | dense NumPy | dense / whole estimate | per-request path: one request | x queue (scaled) | batch per request | speed-up per request | checks |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in sizes.items():
        d, p = r.get("dense", {}), r.get("per_request", {})
        checks = []
        if "agreement" in d:
            checks.append("dense agrees" if d["agreement"]["agrees"] else f"dense DISAGREES {d['agreement']['mismatches']}")
        if "sample_mismatches" in p:
            checks.append(f"reference sample of {p['sample']}: {p['sample_mismatches']} mismatches")
        lines.append(
            f"| {name} | {_s(_get(r, 'batch', 'ratio_basis_s'))} s | {_s(_get(r, 'floor', 'total'))} s | "
            f"{_x(r.get('batch_over_floor'))} | {_x(_over(spec_3_6(r), _get(r, 'floor', 'total')))} | "
            + (f"{_s(d['total_s'])} s | {_x(d.get('over_batch'))}" if "total_s" in d else f"{d.get('skipped', '-')} | -")
            + f" | {_s(p.get('mean_s'))} s | {_s(p.get('scaled_to_queue_s'))} s | {_s(p.get('batch_per_request_s'))} s | "
            f"{_x(p.get('speedup_per_request'))} | {'; '.join(checks) or '-'} |"
        )
    lines += [
        "",
        "The floor reads every input column once (numbers: one reduction; strings: one hash); its split "
        "into numbers and strings is in the JSON. The per-request path's prepare (rows to dicts, once per "
        "snapshot) is not counted in its per-request time; it is in the JSON (`per_request.prepare_s`).",
    ]
    for kind, sweep in results.get("sweeps", {}).items():

        data = series(sweep["points"])
        fixed = ", ".join(f"{k} = {v:,}" for k, v in sweep["fixed"].items())
        xs = "waiting requests" if kind.startswith("requests") else "workers"
        title = "requests, adversarial horde (every request names 2-5 random models)" if kind == "requests-adversarial" else kind
        lines += [
            "",
            f"### Sweep over {title} ({fixed})",
            "",
            f"| {xs} | whole estimate | " + " | ".join(STAGES) + " | **SPEC 3-6** | " + " | ".join(LATER_STAGES)
            + " | floor | dense | per-request path (scaled) | peak RSS |",
            "|---|---|" + "---|" * (len(STAGES) + len(LATER_STAGES) + 5),
        ]
        for i, p in enumerate(sweep["points"]):
            column = lambda key: _s(data.get(key, [None] * len(sweep['x']))[i])  # noqa: E731
            lines.append(
                f"| {_s(sweep['x'][i])} | {_s(data['batch'][i])} | "
                + " | ".join(column(f"stage:{s}") for s in STAGES)
                + f" | **{column('spec_3_6')}** | " + " | ".join(column(f"stage:{s}") for s in LATER_STAGES)
                + f" | {_s(data['floor'][i])} | {_s(data['dense'][i])} | {_s(data['per_request_path'][i])} | "
                f"{_gib(p.get('peak_rss_bytes') or p.get('sampled_peak_rss_bytes'))} |"
                + (f" {p['stopped']}" if "stopped" in p else "")
            )

        fits = {key: fit_exponent(sweep["x"], ys) for key, ys in data.items()}
        row = lambda key: fits.get(key)  # noqa: E731
        lines.append(
            "| **fitted exponent**: all points / upper half / last step | "
            + " | ".join(
                "-" if not row(k) else
                f"{row(k)['exponent']:.2f} / {row(k)['upper_half_exponent']:.2f} / {row(k)['last_step_exponent']:.2f}"
                for k in ["batch", *[f"stage:{s}" for s in STAGES], "spec_3_6", *[f"stage:{s}" for s in LATER_STAGES],
                          "floor", "dense", "per_request_path"]
            )
            + " | |"
        )
    svc = results.get("service")
    if svc:
        history = "with five minutes of dispatch and return history" if svc.get("history") else "no history"
        refresh = svc.get("stall_refresh")
        if refresh:  # the job's cadence: each cycle 5 s on, a request's might_stall sums once per refresh of its age
            history += f", cycles 5 s apart with `--stall-refresh {refresh:g}`"
        lines += ["", f"### The job on PostgreSQL + Redis (2,000 x 50,000, {history}, `benchmarks/service.py`)", ""]
        if "error" in svc:
            lines.append(f"Not measured: {svc['error']}")
        else:
            r = svc.get("status_read_ms", {})
            lines += [
                "| database import | load (median) | SPEC 3-6 | stall | forecasts | estimate (all, median) | publish (median) "
                "| cycle with SPEC 3-6 | whole cycle | status read p50 / p99 | Redis hash |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
                f"| {_s(svc.get('import_s'))} s | {_s(svc.get('median_load_s'))} s | {_s(svc.get('spec_3_6_s'))} s | "
                f"{_s(svc.get('stall_s'))} s | {_s(svc.get('forecasts_s'))} s | {_s(svc.get('median_estimate_s'))} s | "
                f"{_s(svc.get('median_publish_s'))} s | {_s(svc.get('cycle_spec_3_6_s'))} s | {_s(svc.get('cycle_s'))} s | "
                f"{_s(r.get('p50'))} / {_s(r.get('p99'))} ms | "
                f"{_s((svc.get('redis_hash_bytes') or 0) / 2**20)} MiB |",
            ]
    pub = results.get("publish")
    if pub:
        lines += ["", "### Publishing 300,000 requests to Redis (`python -m benchmarks.publish --requests 300000`)", ""]
        if "error" in pub:
            lines.append(f"Not measured: {pub['error']}")
        else:
            lines += [
                "| way | publish (median wall) | client CPU | Redis's CPU | speed-up over per-request |",
                "|---|---|---|---|---|",
                *[
                    f"| {k} | {_s(v)} s | {_s(_get(pub, 'client_cpu_s', k))} s | {_s(_get(pub, 'redis_cpu_s', k))} s | "
                    f"{pub['speedup_vs_per_request'][k]:.2f}x |"
                    for k, v in pub["publish_s"].items()
                ],
                "",
                f"Encoding the payloads (NumPy, before publishing) took {_s(pub.get('encode_s'))} s. "
                + "A status read (one EVALSHA), p50 / p99: "
                + "; ".join(f"{k} {_s(v['p50'])} / {_s(v['p99'])} ms" for k, v in pub.get("status_read_ms", {}).items()),
            ]
    lines += ["", "### Cost per pair of groups", "", *pair_costs(results)]
    notes = results.get("far_from_floor", [])
    lines += ["", "### Far from the floor", ""]
    lines += [f"- {n}" for n in notes] or ["- nothing: every stage within "f"{FAR_FACTOR:g}x the floor"]
    return "\n".join(lines) + "\n"


def _pairs(p: dict[str, Any]) -> tuple[float, float]:
    """(request groups x worker declarations over both gentypes, text competition classes x signatures)."""
    g = p.get("groups") or {}
    elig = sum(
        (g.get(f"{t}_request_groups", 0) + g.get(f"{t}_special_groups", 0)) * g.get(f"{t}_worker_declarations", 0)
        for t in ("text", "image")
    )
    return float(elig), float(g.get("text_competition_classes", 0) * g.get("text_signatures", 0))


def pair_costs(results: dict[str, Any]) -> list[str]:
    """Eligibility and competition time per (group, declaration) and per (class, signature) pair."""
    rows = [
        "| point | workers x requests | eligibility | groups x declarations | ns per pair | competition | classes x signatures | ns per pair |",
        "|---|---|---|---|---|---|---|---|",
    ]
    points = list(results.get("sizes", {}).items()) + [
        (f"{kind} sweep", p) for kind, sw in results.get("sweeps", {}).items() for p in sw["points"]
    ]
    e_ns: list[float] = []
    c_ns: list[float] = []
    for name, p in points:
        st = _get(p, "batch", "stages_s") or p.get("batch_cold_stages_s") or {}
        e, c = _pairs(p)
        if not st or not e:
            continue
        e_ns.append(st.get("eligibility", 0) / e * 1e9)
        if c:
            c_ns.append(st.get("competition", 0) / c * 1e9)
        rows.append(
            f"| {name} | {p['workers']:,} x {p['requests']:,} | {_s(st.get('eligibility'))} s | {e:.3g} | "
            f"{st.get('eligibility', 0) / e * 1e9:.0f} | {_s(st.get('competition'))} s | {c:.3g} | "
            + (f"{st.get('competition', 0) / c * 1e9:.0f} |" if c else "- |")
        )
    if len(e_ns) > 1 and c_ns:
        rows += [
            "",
            f"Over these points eligibility took {min(e_ns):.0f} to {max(e_ns):.0f} ns per (request group, worker "
            f"declaration) pair and competition {min(c_ns):.0f} to {max(c_ns):.0f} ns per (competition class, "
            "signature) pair, while the pair counts span orders of magnitude: the two stages grow as these "
            "products of group counts, which grow with both workers and requests (more distinct model sets and "
            "flag combinations on each side), not with the number of requests as such.",
        ]
    return rows


def main(argv: list[str] | None = None) -> None:
    """Re-render the plot and the README tables from a results file: ``python -m benchmarks.report FILE``."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m benchmarks.report")
    ap.add_argument("results", type=Path, help="a results JSON written by python -m benchmarks")
    ap.add_argument("--readme", type=Path, default=Path(__file__).resolve().parent / "README.md")
    args = ap.parse_args(argv)
    results = json.loads(args.results.read_text(encoding="utf-8"))
    # Judged afresh, so a re-render follows the current rules.
    results["targets"] = targets(results)
    results["far_from_floor"] = far_from_floor(results)
    png = args.results.with_suffix(".png")
    plot(results, png)
    write_readme(results, args.readme, png)


def write_readme(results: dict[str, Any], readme: Path, png: Path) -> None:
    """Replace the generated block of the README (between the markers) with fresh tables."""
    text = readme.read_text(encoding="utf-8") if readme.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    png, readme = png.resolve(), readme.resolve()
    rel = png.relative_to(readme.parent) if png.is_relative_to(readme.parent) else png
    block = f"{BEGIN}\n![time against size]({rel})\n\n{tables(results)}{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
