"""Tables from records: summary.md / summary.csv in the paper's Table 1 layout, baselines,
bootstrap CIs, budget calibration on a dev/test split, quadrants, k ablation, U deciles, and
cross-dataset tau transfer. Numbers in, text out; plots are in plots.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.eval import baselines as bl
from targ_mlx.eval import sweep
from targ_mlx.eval.metrics import bootstrap_ci
from targ_mlx.eval.sweep import Point, Signals
from targ_mlx.gates import SCORED_GATES

BUDGET = (0.05, 0.30)
NAMES = {"never": "Never", "always": "Always", "entropy": "Entropy", "margin": "Margin", "variance": "Variance",
         **bl.LABELS}
CSV_FIELDS = ("method", "k", "tau", "em", "f1", "acc", "rate", "dlat", "tok_draft", "tok_ctx", "tok_out", "tokens",
              "used_ctx", "n")


def _pct(x: float | None) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _lat(p: Point) -> str:
    if p.dlat is None:
        return "-"
    return f"{p.dlat:.3f} (baseline)" if p.method == "never" else f"{p.dlat:+.3f}"


def _tau(p: Point) -> str:
    return "--" if p.tau is None else f"{p.tau:.3g}"


def _row(p: Point, label: str | None = None) -> str:
    tok = f"{p.tok_draft:.1f} / {p.tok_ctx:.0f} / {p.tok_out:.1f}"
    return (f"| {label or NAMES.get(p.method, p.method)} | {_tau(p)} | {_pct(p.em)} / {_pct(p.f1)} | {_pct(p.acc)} | "
            f"{p.rate:.3f} | {_lat(p)} | {tok} |")


HEADER = ("| Method | τ | EM / F1 (%) | Acc (%) | Retrieval rate | Δ latency (s/q) | tokens/q draft / ctx / out |\n"
          "|---|---|---|---|---|---|---|")


def _ci_line(label: str, v: np.ndarray, n_boot: int, seed: int) -> str:
    est, lo, hi = bootstrap_ci(v, n_boot, seed)
    return f"| {label} | {_pct(est)} | [{_pct(lo)}, {_pct(hi)}] |"


def _diff_line(label: str, a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> tuple[str, tuple]:
    est, lo, hi = sweep.paired_ci(a, b, n_boot, seed)
    return f"| {label} | {100 * est:+.1f} | [{100 * lo:+.1f}, {100 * hi:+.1f}] |", (est, lo, hi)


def verdict(vs_never: tuple, vs_always: tuple, metric: str = "EM") -> str:
    (en, ln, _), (ea, la, _) = vs_never, vs_always
    if ln > 0 and la > 0:
        return "YES: it beats both Never and Always (both paired 95% CIs exclude 0)"
    if en > 0 and ea > 0:
        return f"NOT SHOWN: its {metric} is above both Never and Always, but a paired 95% CI includes 0"
    worse = [n for n, e in (("Never", en), ("Always", ea)) if e <= 0]
    return f"NO: its {metric} is not above {' and '.join(worse)}"


METRICS = (("em", "EM"), ("acc", "accuracy"))  # accuracy: a gold answer contained (PopQA's metric)


def _best_calibrated(cal, key: str):
    """The budget with the best dev score on metric `key` (the smaller budget on ties)."""
    return max(cal, key=lambda c: (getattr(c, f"dev_{key}"), -c.rho))


def _calibrated_verdict(cal, t_sig, k: int, n_boot: int, seed: int) -> list[str]:
    """Per metric: ρ chosen on dev by that metric, paired CIs against Never and Always on test."""
    lines = []
    for key, label in METRICS:
        best_c = _best_calibrated(cal, key)
        gated = sweep.correct_vector(t_sig, t_sig.u["margin"][k] > best_c.tau, key)
        l1, vn = _diff_line("Margin − Never", gated, t_sig.never[key], n_boot, seed)
        l2, va = _diff_line("Margin − Always", gated, t_sig.always[key], n_boot, seed)
        lines += [f"**Budget-calibrated margin gate, {label}** (ρ = {best_c.rho:g} chosen by dev {label}, "
                  f"τ = {best_c.tau:.3g}, k = {k}) on the test split: {label} {_pct(float(gated.mean()))}% at retrieval rate "
                  f"{best_c.test.rate:.3f}; Never {_pct(float(t_sig.never[key].mean()))}%, "
                  f"Always {_pct(float(t_sig.always[key].mean()))}%.", "",
                  f"| Paired difference (test split) | {label} points | 95% CI |", "|---|---|---|", l1, l2, "",
                  f"Verdict ({label}): {verdict(vn, va, label)}.", ""]
    return lines


def write_all(name: str, records: Sequence[dict], latency: dict, out: Path, k: int = 20, seed: int = 0,
              n_boot: int = 1000, plots: bool = True, config: dict | None = None) -> dict:
    out = Path(out)
    sig = Signals(records, latency)
    if sig.n == 0:
        (out / "summary.md").write_text(f"# {name}: no records yet\n", encoding="utf-8")
        return {"signals": sig}
    if k not in sig.ks:
        k = min(sig.ks, key=lambda x: abs(x - k))
    points = sweep.gate_points(sig)
    never, always = sweep.never_point(sig), sweep.always_point(sig)
    dev, test = sweep.split(sig.n, seed)
    skr_score = None
    vecs = _question_vectors(records, config)
    if vecs is not None and len(dev) and len(test):
        skr_score = np.full(sig.n, np.nan)
        skr_score[test] = bl.skr_scores(vecs[dev], sig.delta[dev], vecs[test])
    base_points = bl.baseline_points(sig, None, have_probes=True)
    if skr_score is not None:
        t_sig = sig.subset(test)
        base_points += [Point(**{**p.__dict__, "method": "skr"}) for p in
                        (bl.skr(t_sig, skr_score[test], th) for th in bl.THETAS["skr"])]
    chosen = {g: sweep.best_at_budget(points, g, k, *BUDGET) for g in SCORED_GATES}
    lines = [f"# {name}: TARG evaluation", ""]
    cfg = config or {}
    st = cfg.get("settings", {})
    run = cfg.get("run", {})
    lines += [f"n = {sig.n} questions; model {cfg.get('model', '?')}; index `{cfg.get('index', '?')}`; "
              f"prompt `{st.get('prompt_style', '?')}`; top-K {st.get('top_k', '?')}, L_ctx {st.get('context_tokens', '?')} "
              f"tokens; max tokens {st.get('max_tokens', '?')}; k = {k} in the table; "
              f"latency timed at batch 1 on {len(sig.lat_rows)} questions.", ""]
    if run.get("questions_per_hour"):
        lines += [f"Record throughput: {run['questions_per_hour']:.0f} questions/hour "
                  f"({run['records_new']} new records in {run['records_seconds']:.0f} s).", ""]
    stages = ("retrieval", "draft", "always", "probes")
    per = {st_: float(np.mean([r.get("cost", {}).get(st_, 0.0) for r in records])) for st_ in stages}
    tot = sum(per.values())
    if tot > 0:
        lines += [f"Record pass, batched, seconds per question by stage: " + ", ".join(f"{k_} {v:.2f}" for k_, v in per.items())
                  + f"; total {tot:.2f} s/q = {3600 / tot:.0f} questions/hour of model time.", ""]
    lines += ["## Table 1 layout (per gate: best EM at a retrieval rate in 5–30%)", "", HEADER, _row(never), _row(always)]
    for g in SCORED_GATES:
        p = chosen[g]
        if p is None:
            b = sweep.best_overall(points, g, k)
            lines.append(_row(b, f"{NAMES[g]} (no point in budget; best overall)") if b else f"| {NAMES[g]} | - | - | - | - | - | - |")
        else:
            lines.append(_row(p))
    lines += ["", "Acc = a gold answer contained in the output (STR-EM for ASQA). Δ latency is added seconds "
              "per query over Never-RAG at batch 1; the Never row shows its absolute latency.", ""]
    lines += ["## Baselines (strict budget: <= 1 retrieval, <= 1 reflection per query)", "", HEADER, _row(never), _row(always)]
    for p in bl.default_rows(base_points):
        label = f"{NAMES[p.method]} (θ={p.tau:g})" + (f", context used {p.used_ctx:.3f}" if p.used_ctx is not None else "")
        if p.method == "skr":
            label += f", test split n={p.n}"
        lines.append(_row(p, label))
    if chosen["margin"] is not None:
        lines.append(_row(chosen["margin"], "TARG-Margin"))
    lines += [""]
    # bootstrap CIs
    for key, label in METRICS:
        lines += [f"## Bootstrap 95% CIs of {label} ({n_boot} resamples over questions)", "",
                  f"| Method | {label} (%) | 95% CI |", "|---|---|---|",
                  _ci_line("Never", sig.never[key], n_boot, seed), _ci_line("Always", sig.always[key], n_boot, seed)]
        for g in SCORED_GATES:
            p = chosen[g]
            if p is not None:
                v = sweep.correct_vector(sig, sig.u[g][k] > p.tau, key)
                lines.append(_ci_line(f"{NAMES[g]} k={k} τ={p.tau:.3g}", v, n_boot, seed))
        lines += [""]
    # budget calibration
    lines += ["## Budget calibration (τ from the dev split's CDF of U, applied to the test split)", "",
              f"dev n = {len(dev)}, test n = {len(test)} (seeded split, seed {seed}).", "",
              "| Gate | ρ | τ | dev rate | dev EM / Acc (%) | test rate | test EM / F1 / Acc (%) | test Δ latency |",
              "|---|---|---|---|---|---|---|---|"]
    cal = {g: sweep.calibrate(sig, g, k, dev, test) for g in SCORED_GATES}
    for g in SCORED_GATES:
        for c in cal[g]:
            lines.append(f"| {NAMES[g]} | {c.rho:g} | {c.tau:.3g} | {c.dev_rate:.3f} | {_pct(c.dev_em)} / {_pct(c.dev_acc)} | "
                         f"{c.test.rate:.3f} | {_pct(c.test.em)} / {_pct(c.test.f1)} / {_pct(c.test.acc)} | "
                         f"{'-' if c.test.dlat is None else f'{c.test.dlat:+.3f}'} |")
    t_sig = sig.subset(test)
    lines += [""] + _calibrated_verdict(cal["margin"], t_sig, k, n_boot, seed)
    best_c = _best_calibrated(cal["margin"], "em")
    # quadrants on dev
    tau_q = chosen["margin"].tau if chosen["margin"] is not None else best_c.tau
    d_sig = sig.subset(dev)
    q = sweep.quadrants(d_sig.u["margin"][k], d_sig.delta, tau_q)
    lines += [f"## Quadrants over (U, Δ) on the dev split (margin, k = {k}, τ = {tau_q:.3g}; % of queries)", "",
              "| (a) Low U, Δ>0 | (b) High U, Δ<0 | (c) High U, Δ>0 | (d) Low U, Δ≤0 | (e) High U, Δ=0 |", "|---|---|---|---|---|",
              f"| {q['a']:.1f} | {q['b']:.1f} | {q['c']:.1f} | {q['d']:.1f} | {q['e']:.1f} |", ""]
    # k ablation
    taus = (0.1, 0.2, 0.3, 0.5)
    lines += ["## Prefix-length ablation (margin): EM / F1 [retrieval rate] in %", "",
              "| k | " + " | ".join(f"τ={t:g}" for t in taus) + " |", "|---" * (len(taus) + 1) + "|"]
    for kk in sig.ks:
        cells = [sweep.gate_point(sig, "margin", kk, t) for t in taus]
        lines.append(f"| {kk} | " + " | ".join(f"{_pct(c.em)} / {_pct(c.f1)} [{_pct(c.rate)}]" for c in cells) + " |")
    lines += ["", f"Mean greedy draft length: {sig.draft_len.mean():.1f} tokens (drafts stop at EOS, so larger k reads "
              "no further on short answers).", ""]
    # deciles
    for key, label in METRICS:
        lines += [f"## Never-RAG {label} by U decile (k = {k}; low U first)", "",
                  "| Gate | " + " | ".join(f"D{i + 1}" for i in range(10)) + " |", "|---" * 11 + "|"]
        for g in SCORED_GATES:
            dec = sweep.deciles(sig.u[g][k], sig.never[key])
            lines.append(f"| {NAMES[g]} | " + " | ".join(_pct(m) for _, _, m in dec) + " |")
        lines += [""]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text, encoding="utf-8")
    table = [never, always] + [p for p in chosen.values() if p is not None] + bl.default_rows(base_points)
    _write_csv(out / "summary.csv", table)
    _write_csv(out / "points.csv", [never, always] + points + base_points)
    if plots:
        from targ_mlx.eval import plots as pl

        pl.write_all(sig, points, never, always, out, k)
    best = sweep.best_overall(points, "margin", k)
    return {"signals": sig, "best_margin_tau": None if best is None else best.tau, "k": k}


def _write_csv(path: Path, pts: Sequence[Point]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for p in pts:
            w.writerow(p.to_dict())


def _question_vectors(records: Sequence[dict], config: dict | None) -> np.ndarray | None:
    """Question embeddings for SKR, with the index's encoder; None when it cannot load."""
    try:
        from targ_mlx.index import load_encoder

        from targ_mlx.index.encoder import backend_of

        name = backend = None
        index = (config or {}).get("index")
        if index and Path(index, "manifest.json").is_file():
            manifest = json.loads(Path(index, "manifest.json").read_text())
            name, backend = manifest["encoder"]["name"], backend_of(manifest)
        return np.asarray(load_encoder(name, backend=backend).encode_queries([r["question"] for r in records]), dtype=np.float32)
    except Exception as e:  # SKR is optional: a missing encoder drops its rows, not the report
        import logging

        logging.getLogger(__name__).warning("SKR skipped: cannot encode questions (%s)", e)
        return None


def transfer_table(summaries: dict[str, dict], k: int = 20) -> str:
    """Cross-dataset tau transfer (margin gate): the best tau of each source applied to each target."""
    lines = [f"# Cross-dataset τ transfer (margin, k = {k}; best-EM τ of the source applied zero-shot)", "",
             "| Source → target | τ | Transferred EM (%) | Re-tuned EM (%) | Δ |", "|---|---|---|---|---|"]
    for src, s in summaries.items():
        if s.get("best_margin_tau") is None:
            continue
        for dst, d in summaries.items():
            if dst == src or "signals" not in d or d["signals"].n == 0:
                continue
            sig, kk = d["signals"], d.get("k", k)
            moved = sweep.gate_point(sig, "margin", kk, s["best_margin_tau"])
            best = sweep.best_overall(sweep.gate_points(sig, ("margin",), (kk,)), "margin", kk)
            lines.append(f"| {src} → {dst} | {s['best_margin_tau']:.3g} | {_pct(moved.em)} | {_pct(best.em)} | "
                         f"{100 * (moved.em - best.em):+.1f} |")
    return "\n".join(lines) + "\n"
