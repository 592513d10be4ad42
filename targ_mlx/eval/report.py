"""Rendering: summary.md / summary.csv / points.csv from the numbers `analysis.py` computes
(verdicts against Never, Always and a random gate, controls, AUROCs, matched-budget baselines,
calibration, quadrants, k ablation and slices, re-check, U deciles) and the cross-dataset tau
transfer. Numbers in, text out; figures are plots.py's.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.eval import analysis as an
from targ_mlx.eval import baselines as bl
from targ_mlx.eval import sweep
from targ_mlx.eval.metrics import bootstrap_ci
from targ_mlx.eval.sweep import Point, Signals
from targ_mlx.eval.formats import auc as _auc
from targ_mlx.eval.formats import ci as _ci
from targ_mlx.eval.formats import label as gate_label
from targ_mlx.eval.formats import pct as _pct
from targ_mlx.eval.overview import overview_table, transfer_table  # noqa: F401  (re-exported)
from targ_mlx.gates import scored_names

CSV_FIELDS = ("method", "k", "tau", "em", "f1", "acc", "rate", "dlat", "tok_draft", "tok_ctx", "tok_out", "tokens",
              "used_ctx", "n")


def _lat(p: Point) -> str:
    if p.dlat is None:
        return "-"
    return f"{p.dlat:.3f} (baseline)" if p.method == "never" else f"{p.dlat:+.3f}"


def _tau(p: Point) -> str:
    return "--" if p.tau is None else f"{p.tau:.3g}"


def _row(p: Point, label: str | None = None) -> str:
    tok = f"{p.tok_draft:.1f} / {p.tok_ctx:.0f} / {p.tok_out:.1f}"
    return (f"| {label or gate_label(p.method)} | {_tau(p)} | {_pct(p.em)} / {_pct(p.f1)} | {_pct(p.acc)} | "
            f"{p.rate:.3f} | {_lat(p)} | {tok} |")


HEADER = ("| Method | τ | EM / F1 (%) | Acc (%) | Retrieval rate | Δ latency (s/q) | tokens/q draft / ctx / out |\n"
          "|---|---|---|---|---|---|---|")


def _ci_line(label: str, v: np.ndarray, n_boot: int, seed: int) -> str:
    est, lo, hi = bootstrap_ci(v, n_boot, seed)
    return f"| {label} | {_pct(est)} | [{_pct(lo)}, {_pct(hi)}] |"


SELECTED_SOURCES = ("dpr_wiki18_via_searchr1_traces", "nq_open_gold_lost_in_the_middle")


def corpus_regime(corpora: Sequence[str]) -> str:
    """'seeded' when an index holds the wiki_pool parts selected per evaluated question; else
    'large' when it holds a general slice of Wikipedia (a dump's articles, not chosen for any
    question: the enwiki/simplewiki files, a dump, wikimedia/wikipedia); else 'clean'."""
    for c in corpora:
        path, _, query = str(c).partition("?")
        if Path(path).name == "wiki_pool.jsonl":
            picked = query.partition("=")[2].split(",") if query else SELECTED_SOURCES
            if any(sp in picked for sp in SELECTED_SOURCES):
                return "seeded"
    if any(Path(str(c)).name.startswith(("enwiki", "simplewiki")) or str(c).startswith("hf:wikimedia/")
           for c in corpora):
        return "large"
    return "clean"


REGIME_TEXT = {"seeded": "**seeded** — includes passages selected for the evaluated questions (an oracle-like "
                         "retrieval regime)",
               "clean": "**clean** — no passages selected per evaluated question",
               "large": "**large** — general slices of Wikipedia (whole articles, none selected per evaluated "
                        "question) beside the Vital leads"}


def _verdict_lines(v: an.Verdict) -> list[str]:
    lab = an.LABEL[v.metric]
    a = v.answers()
    what = "reading" if v.gate_name == "evidence" else "retrieval"
    return [f"**Budget-calibrated {v.gate_name} gate, {lab}** (ρ = {v.rho:g} chosen by dev {lab}; τ = {v.tau:.4g} from the "
            f"dev split by the one budget rule; k = {v.k}), on the test split (n = {v.n}): {lab} {_pct(v.gate)}% at "
            f"{what} rate {v.rate:.3f}{'; it searches every question' if v.gate_name == 'evidence' else ''}. Never {_pct(v.never)}%, Always {_pct(v.always)}%, a random gate at the same "
            f"rate {_pct(v.random.expected)}% (95% band {_pct(v.random.lo)}–{_pct(v.random.hi)}; P(random ≥ gate) = "
            f"{v.random.p_at_least:.2f}), the oracle at the same rate {_pct(v.oracle)}%.", "",
            f"| Paired difference (test split) | {lab} points [95% CI] | answer |", "|---|---|---|",
            f"| gate − Never | {_ci(v.vs_never)} | beats Never: {a['never']} |",
            f"| gate − Always | {_ci(v.vs_always)} | beats Always: {a['always']} |",
            f"| gate − random at the same rate | {_ci(v.vs_random)} | beats random: {a['random']} |", ""]


def _record_run(cfg: dict) -> dict:
    """The last run that made records (a later one may only have timed latency or filled hit@K)."""
    made = [r for r in cfg.get("runs") or [cfg.get("run") or {}] if r.get("records_new")]
    return made[-1] if made else cfg.get("run") or {}


def render(name: str, sig: Signals, a: an.Analysis, points, never: Point, always: Point, base_points, cal,
           dev, test, cfg: dict, n_boot: int, seed: int) -> str:
    k, head = a.k, a.headline
    st, run = cfg.get("settings", {}), _record_run(cfg)
    regime = cfg.get("corpus_regime")
    other = "em" if head == "acc" else "acc"
    pool = sweep.split_pool(cfg)
    extended = (f" (the first {pool} split into dev and test halves; the {sig.n - pool} added after them "
                "with `--split-pool` are all test)" if pool and sig.n > pool else "")
    lines = [f"# {name}: TARG evaluation", "",
             f"n = {sig.n} questions{extended}; model {cfg.get('model', '?')}; index `{cfg.get('index', '?')}`"
             + (f" ({REGIME_TEXT[regime]})" if regime else "")
             + (f", searched by {cfg['retriever']}" if cfg.get("retriever") else "") + f"; prompt `{st.get('prompt_style', '?')}`; "
             f"top-K {st.get('top_k', '?')}, L_ctx {st.get('context_tokens', '?')} tokens; max tokens "
             f"{st.get('max_tokens', '?')}; k = {k} in the tables; latency timed at batch 1 on {len(sig.lat_rows)} questions.",
             ""]
    if a.hit_at_k is not None:
        lines += [f"Answer hit@{st.get('top_k', 5)} of the index (a gold answer string in the retrieved passages): "
                  f"{100 * a.hit_at_k:.1f}% of questions.", ""]
    em_max = max(float(sig.never["em"].mean()), float(sig.always["em"].mean()))
    if head == "acc":
        lines += [f"**Headline metric: accuracy** (a gold answer contained). EM is below {100 * an.UNINFORMATIVE:.0f}% "
                  f"for both Never and Always ({100 * em_max:.1f}% at most: the model answers in sentences), so EM "
                  "comparisons carry no information here; EM tables are kept for completeness.", ""]
    else:
        lines += ["**Headline metric: EM**; accuracy (a gold answer contained) is reported beside it.", ""]
    if run.get("questions_per_hour"):
        lines += [f"Record throughput: {run['questions_per_hour']:.0f} questions/hour "
                  f"({run['records_new']} new records in {run['records_seconds']:.0f} s).", ""]
    per = {s_: float(np.mean([r.get("cost", {}).get(s_, 0.0) for r in sig.records])) for s_ in
           ("retrieval", "draft", "always", "probes")}
    if sum(per.values()) > 0:
        lines += ["Record pass, batched, seconds per question by stage: " + ", ".join(f"{k_} {v:.2f}" for k_, v in per.items())
                  + f"; total {sum(per.values()):.2f} s/q.", ""]
    lines += ["## Verdict: does the gate beat Never, Always, and a random gate at the same rate?", ""]
    for m in (head, other):
        lines += _verdict_lines(a.verdicts[m])
    if "evidence" in a.gate_verdicts:
        lines += ["### The evidence gate (search first, then decide whether to read)", "",
                  "It searches every question (milliseconds on a local index), then reads only where P(Always right | "
                  "top-1 similarity, support) × P(Never wrong | U_mar, confirmed) > τ (the first the mean of a "
                  "calibration of each; calibrations fitted on dev-half records, "
                  "`targ_mlx/gates/evidence_calibration.json`). Same protocol and controls as above; its rate is the "
                  "reading rate (search rate 1.0).", ""]
        for m in (head, other):
            v, d = a.gate_verdicts["evidence"][m], a.vs_margin["evidence"][m]
            lines += _verdict_lines(v)[:-1] + [f"| evidence gate − margin gate (each at its own τ) | {_ci(d)} | |", ""]
    lines += _table1(a, never, always, head) + _table1(a, never, always, other)
    lines += _matched(a, head) + _baselines(never, always, base_points)
    lines += _auroc(a, head, n_boot)
    lines += _calibration(cal, dev, test)
    for m in (head, other):
        lab = an.LABEL[m]
        q = a.quadrants[m]
        lines += [f"## Quadrants over (U, Δ{lab}) on the dev split (margin, k = {k}, τ of the {an.LABEL[head]} verdict; "
                  "% of queries)", "",
                  "| (a) Low U, Δ>0 | (b) High U, Δ<0 | (c) High U, Δ>0 | (d) Low U, Δ≤0 | (e) High U, Δ=0 |",
                  "|---|---|---|---|---|",
                  f"| {q['a']:.1f} | {q['b']:.1f} | {q['c']:.1f} | {q['d']:.1f} | {q['e']:.1f} |", ""]
    lines += _k_tables(a, sig, head) + _k_tables(a, sig, other)
    lines += _recheck(a, head)
    lines += _variance_length(a)
    lines += _cis(sig, a, n_boot, seed)
    for m in (head, other):
        lines += [f"## Never-RAG {an.LABEL[m]} by U decile (k = {k}; low U first)", "",
                  "| Gate | " + " | ".join(f"D{i + 1}" for i in range(10)) + " |", "|---" * 11 + "|"]
        for g, dec in a.deciles[m].items():
            lines.append(f"| {gate_label(g)} | " + " | ".join(_pct(x) for _, _, x in dec) + " |")
        lines += [""]
    return "\n".join(lines)


def _table1(a: an.Analysis, never: Point, always: Point, m: str) -> list[str]:
    lab = an.LABEL[m]
    lines = [f"## Table 1 layout, {lab}: per gate the best point at a 5–30% retrieval rate, beside random and oracle", "",
             HEADER.replace("| tokens/q draft / ctx / out |", "| tokens/q draft / ctx / out | random at same rate "
                            f"{lab} [95% band] | oracle at same rate |").replace("|---|---|---|---|---|---|---|",
                                                                                 "|---|---|---|---|---|---|---|---|---|"),
             _row(never) + " | |", _row(always) + " | |"]
    for g, p, c in a.table1[m]:
        if p is None:
            lines.append(f"| {gate_label(g)} | no point in 5–30% | | | | | | | |")
        else:
            lines.append(_row(p) + f" {_pct(c.random.expected)} [{_pct(c.random.lo)}, {_pct(c.random.hi)}] | "
                         f"{_pct(c.oracle)} |")
    return lines + ["", f"Chosen by {lab} on all questions (an optimistic, in-sample choice: the verdict above uses a "
                    "dev/test split). Acc = a gold answer contained. Δ latency is added seconds per query over "
                    "Never-RAG at batch 1; the Never row shows its absolute latency.", ""]


def _matched(a: an.Analysis, m: str) -> list[str]:
    lab = an.LABEL[m]
    rates = an.MATCHED_RATES
    lines = [f"## Matched budgets, {lab} (test split): every method retrieves the top share of questions by its own "
             "score", "", "| Method | " + " | ".join(f"rate {r:g}" for r in rates) + " |", "|---" * (len(rates) + 1) + "|"]
    for row in a.matched[m]:
        lines.append(f"| {row.name} | " + " | ".join(_pct(row.scores[r]) for r in rates) + " |")
    return lines + ["", "Each baseline is swept over its own threshold (θ at the quantile of its score that gives the "
                    "rate). Scores: Self-Eval P(yes) to \"do you need to look this up?\"; FLARE 1 − min token p of the "
                    "Never answer; Self-RAG-lite 1 − P(the draft answer is supported); SKR the mean label (retrieval "
                    "helped +1 / hurt −1) of the 10 nearest dev questions. CRAG-lite always retrieves (rate 1) and "
                    "only decides whether to keep the context, so it has no row at a matched retrieval budget; it "
                    "appears in the baselines table below.", ""]


def _baselines(never: Point, always: Point, base_points) -> list[str]:
    lines = ["## Baselines at their default θ (strict budget: ≤ 1 retrieval, ≤ 1 reflection per query)", "", HEADER,
             _row(never), _row(always)]
    for p in bl.default_rows(base_points):
        label = f"{gate_label(p.method)} (θ={p.tau:g})" + (f", context used {p.used_ctx:.3f}" if p.used_ctx is not None else "")
        if p.method == "skr":
            label += f", test split n={p.n}"
        lines.append(_row(p, label))
    return lines + [""]


def _auroc(a: an.Analysis, head: str, n_boot: int) -> list[str]:
    lines = []
    for m in (head, "em" if head == "acc" else "acc"):
        lab = an.LABEL[m]
        lines += [f"## AUROC of each score ({lab}; 95% bootstrap CI, {n_boot} resamples; 0.5 = chance)", "",
                  "| Score (higher = retrieve) | (a) Never answer wrong | (b) retrieval helps (Always right, Never wrong) | "
                  "(c) Always right, among Never wrong | (d) answer in the top-K passages |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r.name} | {_auc(r.never_wrong)} | {_auc(r.helps)} | {_auc(r.rescued)} | {_auc(r.covered)} |"
                  for r in a.aurocs[m]]
        lines += ["", "(b) needs (a) and (c): a score that ranks (a) well but (c) or (d) below 0.5 picks questions the "
                  "model does not know *and* the corpus does not cover, which retrieval cannot fix.",
                  f"- : fewer than {an.MIN_CLASS} questions in one class (or no hit@K in the records), no AUROC.", ""]
    return lines


def _calibration(cal, dev, test) -> list[str]:
    lines = ["## Budget calibration (τ from the dev split by the one budget rule, applied to the test split)", "",
             f"dev n = {len(dev)}, test n = {len(test)}. τ is `calibration.budget_threshold`, the rule `targ-calibrate "
             "--budget` uses (exact, tie-aware).", "",
             "| Gate | ρ | τ | dev rate | dev EM / Acc (%) | test rate | test EM / F1 / Acc (%) | test Δ latency |",
             "|---|---|---|---|---|---|---|---|"]
    for g, rows in cal.items():
        for c in rows:
            lines.append(f"| {gate_label(g)} | {c.rho:g} | {c.tau:.4g} | {c.dev_rate:.3f} | {_pct(c.dev_em)} / {_pct(c.dev_acc)} | "
                         f"{c.test.rate:.3f} | {_pct(c.test.em)} / {_pct(c.test.f1)} / {_pct(c.test.acc)} | "
                         f"{'-' if c.test.dlat is None else f'{c.test.dlat:+.3f}'} |")
    return lines + [""]


def _k_tables(a: an.Analysis, sig: Signals, m: str) -> list[str]:
    lab = an.LABEL[m]
    taus = an.PAPER_TAUS
    lines = [f"## Prefix-length ablation (margin), {lab} [retrieval rate], the paper's τ grid", "",
             "| k | " + " | ".join(f"τ={t:g}" for t in taus) + " |", "|---" * (len(taus) + 1) + "|"]
    for kk, cells in a.k_grid[m].items():
        lines.append(f"| {kk} | " + " | ".join(f"{_pct(c.score)} [{_pct(c.rate)}]" for c in cells) + " |")
    rates = an.MATCHED_RATES
    lines += ["", f"Same, with τ set per k to a retrieval budget (1-D slice: {lab} against k at a fixed budget):", "",
              "| k | " + " | ".join(f"ρ={r:g}" for r in rates) + " |", "|---" * (len(rates) + 1) + "|"]
    for kk, cells in a.k_at_budget[m].items():
        lines.append(f"| {kk} | " + " | ".join(f"{_pct(c.score)} [{_pct(c.rate)}]" for c in cells) + " |")
    return lines + ["", f"Mean greedy draft length: {sig.draft_len.mean():.1f} tokens (drafts stop at EOS, so larger k "
                    "reads no further on short answers).", ""]


def _recheck(a: an.Analysis, m: str) -> list[str]:
    lab = an.LABEL[m]
    lines = [f"## Dynamic re-check (every {an.RECHECK_EVERY} tokens) vs single-shot, margin, {lab} [retrieval rate]", "",
             "| τ | single-shot (k = {0}) | re-check |".format(a.k), "|---|---|---|"]
    for r in a.recheck[m]:
        lines.append(f"| {r.tau:g} | {_pct(r.single.score)} [{_pct(r.single.rate)}] | {_pct(r.recheck.score)} "
                     f"[{_pct(r.recheck.rate)}] |")
    return lines + ["", "Read from the records: re-check retrieves iff U of the running greedy prefix exceeds τ at any "
                    "checkpoint (10, 20, ... tokens, up to the recorded draft); a triggered answer is scored as the "
                    "Always answer (the record has no mid-answer continuation with context).", ""]


def _variance_length(a: an.Analysis) -> list[str]:
    v = a.variance_length
    if v is None:
        return []
    return ["## How much of U_var is answer length", "",
            f"U_var counts a sample that stopped (EOS) as repeating a 'stopped' token to step k, and divides by k. "
            f"{100 * v.share_short:.0f}% of greedy drafts end before k = {v.k} tokens. Spearman correlation of U_var "
            f"with the draft's length: {v.spearman_len:+.2f}; AUROC of U_var for \"the draft ended before k\": "
            f"{_auc(v.auroc_short)}.", ""]


def _cis(sig: Signals, a: an.Analysis, n_boot: int, seed: int) -> list[str]:
    lines = []
    for m in (a.headline, "em" if a.headline == "acc" else "acc"):
        lab = an.LABEL[m]
        lines += [f"## Bootstrap 95% CIs of {lab} ({n_boot} resamples over questions)", "",
                  f"| Method | {lab} (%) | 95% CI |", "|---|---|---|",
                  _ci_line("Never", sig.never[m], n_boot, seed), _ci_line("Always", sig.always[m], n_boot, seed)]
        for g, p, _ in a.table1[m]:
            if p is not None:
                v = sweep.correct_vector(sig, sig.u[g][a.k] > p.tau, m)
                lines.append(_ci_line(f"{gate_label(g)} k={a.k} τ={p.tau:.3g}", v, n_boot, seed))
        lines += [""]
    return lines


def write_all(name: str, records: Sequence[dict], latency: dict, out: Path, k: int = 20, seed: int = 0,
              n_boot: int = 1000, plots: bool = True, config: dict | None = None,
              meta: dict[str, dict] | None = None) -> dict:
    out = Path(out)
    sig = Signals(records, latency, meta)
    if sig.n < 2:  # the verdicts choose tau on a dev half and judge it on the other: none with one question
        (out / "summary.md").write_text(f"# {name}: {'no records yet' if not sig.n else '1 record'}; the tables "
                                        "need at least 2 (a dev and a test half)\n", encoding="utf-8")
        return {"signals": sig}
    if k not in sig.ks:
        k = min(sig.ks, key=lambda x: abs(x - k))
    cfg = config or {}
    points = sweep.gate_points(sig)
    never, always = sweep.never_point(sig), sweep.always_point(sig)
    dev, test = sweep.split(sig.n, seed, pool=sweep.split_pool(cfg))
    skr_test = None
    vecs = _question_vectors(records, config)
    if vecs is not None and len(dev) and len(test):
        skr_test = bl.skr_scores(vecs[dev], sig.delta[dev], vecs[test])
    base_points = bl.baseline_points(sig, None, have_probes=True)
    if skr_test is not None:
        t_sig = sig.subset(test)
        base_points += [Point(**{**p.__dict__, "method": "skr"}) for p in
                        (bl.skr(t_sig, skr_test, th) for th in bl.THETAS["skr"])]
    beta = float(cfg.get("settings", {}).get("beta", 3.0))
    a = an.analyse(sig, points, k, seed, n_boot, beta, skr_test, dev, test)
    cal = {g: sweep.calibrate(sig, g, k, dev, test) for g in scored_names() if np.isfinite(sig.u[g][k]).all()}
    text = render(name, sig, a, points, never, always, base_points, cal, dev, test, cfg, n_boot, seed)
    (out / "summary.md").write_text(text, encoding="utf-8")
    chosen = [p for m in an.METRICS for _, p, _ in a.table1[m] if p is not None]
    _write_csv(out / "summary.csv", [never, always] + chosen + bl.default_rows(base_points))
    _write_csv(out / "points.csv", [never, always] + points + base_points)
    if plots:
        from targ_mlx.eval import plots as pl

        pl.write_all(sig, a, points, never, always, out)
    best = {m: sweep.best_overall(points, "margin", k, metric=m) for m in an.METRICS}
    return {"signals": sig, "best_margin_tau": {m: (None if b is None else b.tau) for m, b in best.items()}, "k": k,
            "analysis": a}


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

        from targ_mlx.index.encoder import query_backend

        name = backend = None
        index = (config or {}).get("index")
        if index and Path(index, "manifest.json").is_file():
            manifest = json.loads(Path(index, "manifest.json").read_text())
            name, backend = manifest["encoder"]["name"], query_backend(manifest)
        return np.asarray(load_encoder(name, backend=backend).encode_queries([r["question"] for r in records]), dtype=np.float32)
    except Exception as e:  # SKR is optional: a missing encoder drops its rows, not the report
        import logging

        logging.getLogger(__name__).warning("SKR skipped: cannot encode questions (%s)", e)
        return None
