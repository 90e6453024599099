"""The paper's claims, each checked on the runs of a sweep: our figure, its spread, the p-value, the minimum detectable
effect and a verdict, one row per claim (`gatelab claims`).

A claim is data: which sweep, which two groups of runs (a variant plus any other swept keys, as in `gatelab table`),
which metric, and which way the paper says it goes. Runs of one seed share data order and initialisation, so two
groups are compared paired by seed (`stats.compare`).

Verdicts, stated once here and printed under the table:
- a direction ("lower", "higher"): *holds* when the paired difference goes the paper's way at p < 0.05; *does not hold*
  when it goes the other way at p < 0.05, or, for perplexity, when it is not significant although an effect of the
  paper's relative size would have been detected (MDE below it); otherwise *inconclusive*.
- "close": the 95% interval of the paired difference inside +-half the G1 elementwise gain over baseline (the same
  sweep and seeds) *holds*; entirely outside it *does not hold*; otherwise *inconclusive*.
- "below"/"above" a level: the 95% interval of the mean below (above) it *holds*; above (below) it *does not hold*.
- "smaller change": the paired difference-in-differences of log perplexity between two settings (e.g. 4x the learning
  rate): a group whose perplexity rises less, tested like a direction; a diverged run counts against its group.
- "rank": Kendall's tau of our means against the paper's: tau > 0 at p < 0.05 *holds*, tau < 0 at p < 0.05 *does not
  hold*, otherwise *inconclusive*.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gatelab.paper import missing_note
from gatelab.report.stats import compare, mean_std, rank_agreement
from gatelab.report.tables import PPL, RunRecord, paper_reference

Kind = Literal["lower", "higher", "close", "below", "above", "smaller change", "rank"]
HOLDS, FAILS, INCONCLUSIVE, NOT_RUN = "holds", "does not hold", "inconclusive at this scale", "not run"
ALPHA = 0.05
CLOSE_MARGIN = 0.5  # "close": within half of the G1 elementwise gain over baseline


def _long_context(metrics: Mapping[str, float]) -> float:
    """ln of how much perplexity grows from the training length to the positions beyond it at 8x."""
    if "long_ppl_beyond_train/x8" not in metrics or "long_ppl/x1" not in metrics:
        return math.nan
    return math.log(metrics["long_ppl_beyond_train/x8"] / metrics["long_ppl/x1"])


DERIVED: dict[str, Callable[[Mapping[str, float]], float]] = {"long_context_growth": _long_context}


@dataclass(frozen=True)
class Claim:
    claim: str  # the paper's statement, as the table prints it
    sweep: str  # the sweep (by name) whose runs test it
    kind: Kind
    a: str  # the group the claim is about: "g1_elem_sig", or with settings "g1_elem_sig train.lr=0.002"
    b: str | None = None  # what it is compared with (for "smaller change": the other group, see `setting`)
    metric: str = PPL  # an MLflow metric of the runs, or a key of DERIVED
    level: float | None = None  # for "below"/"above"
    setting: tuple[str, str] | None = None  # for "smaller change": (from, to) settings, e.g. the two learning rates
    rank_ids: tuple[str, ...] = ()  # for "rank": the variants ranked
    paper_table: str | None = None  # the paper's numbers for this claim's variants (a gatelab.paper.SWEEP_TABLES key)
    paper_column: str = "ppl"  # which paper column the paper figure comes from
    paper_ids: tuple[str, str] | None = None  # the paper's row ids for (a, b) where they are not the variant ids
    paper_text: str = ""  # the paper's figure in words, where no single table pair gives it
    why: str = ""  # a note on the row: what the test means at this scale


CORE, MOE, SINK = "repro-core", "repro-table1-3-4", "repro-sink"
BASE, HIGH = "train.lr=0.002", "train.lr=0.008"
MOE_FIGURE = "the paper's figure is its MoE model's (Tables 1 and 4)"
TABLE1_ROWS = ("baseline", "ref_kv8", "ref_q48", "ref_add4experts", "g1_elem_sig", "g2_elem_sig", "g3_elem_sig",
               "g4_elem_sig", "g5_elem_sig", "g1_head_sig", "g2_head_sig", "g1_elem_sig_shared", "g2_elem_sig_shared",
               "g1_elem_silu_add", "g1_elem_silu")
TABLE4_ROWS = ("baseline", "g1_elem_sig", "g1_head_sig", "g1_elem_sig_shared", "g1_inputindep_sig", "g1_elem_nssig")

CLAIMS: tuple[Claim, ...] = (
    Claim("G1 elementwise sigmoid lowers Avg PPL (dense)", CORE, "lower", f"g1_elem_sig {BASE}", f"baseline {BASE}",
          paper_table="table2", paper_ids=("dense28_400b_g1_elem_sig", "dense28_400b_baseline")),
    Claim("G1 elementwise sigmoid lowers Avg PPL (MoE)", MOE, "lower", "g1_elem_sig", "baseline", paper_table="table1"),
    *(Claim(f"G1's gain beats the parameter-matched reference {ref}", MOE, "lower", "g1_elem_sig", ref,
            paper_table="table1") for ref in ("ref_kv8", "ref_q48", "ref_add4experts")),
    Claim("G1 beats G2 (MoE)", MOE, "lower", "g1_elem_sig", "g2_elem_sig", paper_table="table1"),
    Claim("G1 beats G2 (dense)", CORE, "lower", f"g1_elem_sig {BASE}", f"g2_elem_sig {BASE}", paper_table="table1",
          why=MOE_FIGURE),
    *(Claim(f"G2 beats {g.upper()}", MOE, "lower", "g2_elem_sig", f"{g}_elem_sig", paper_table="table1")
      for g in ("g3", "g4", "g5")),
    Claim("G2 beats G5 (dense)", CORE, "lower", f"g2_elem_sig {BASE}", f"g5_elem_sig {BASE}", paper_table="table1",
          why=MOE_FIGURE),
    Claim("Headwise is close to elementwise (MoE)", MOE, "close", "g1_head_sig", "g1_elem_sig", paper_table="table1"),
    Claim("Headwise is close to elementwise (dense)", CORE, "close", f"g1_head_sig {BASE}", f"g1_elem_sig {BASE}",
          paper_table="table2", paper_ids=("dense48_400b_g1_head_sig_lr4e-3", "dense48_400b_g1_elem_sig_lr4e-3")),
    Claim("Head-specific beats head-shared (G1)", MOE, "lower", "g1_elem_sig", "g1_elem_sig_shared",
          paper_table="table1"),
    Claim("Head-specific beats head-shared (G2)", MOE, "lower", "g2_elem_sig", "g2_elem_sig_shared",
          paper_table="table1"),
    Claim("Multiplicative beats additive (sigmoid x vs SiLU +)", MOE, "lower", "g1_elem_sig", "g1_elem_silu_add",
          paper_table="table1", why="the paper's own pair: its additive gate is SiLU"),
    Claim("Multiplicative vs additive, same activation (SiLU x vs SiLU +)", MOE, "lower", "g1_elem_silu",
          "g1_elem_silu_add", paper_table="table1", why="the paper finds no difference here (5.822 vs 5.821)"),
    Claim("Sigmoid beats SiLU (multiplicative G1)", MOE, "lower", "g1_elem_sig", "g1_elem_silu", paper_table="table1"),
    Claim("Non-linearity alone helps: RMSNorm after SDPA", MOE, "lower", "g1_rmsnorm", "baseline",
          paper_table="table3"),
    Claim("Non-linearity alone helps: parameter-free SiLU after SDPA", MOE, "lower", "g1_silu_noparam", "baseline",
          paper_table="table3"),
    Claim("... but only part of the gain: RMSNorm trails the sigmoid gate", MOE, "lower", "g1_elem_sig", "g1_rmsnorm",
          paper_table="table3"),
    Claim("... but only part of the gain: SiLU trails the sigmoid gate", MOE, "lower", "g1_elem_sig",
          "g1_silu_noparam", paper_table="table3"),
    Claim("The G1 gate score is sparse (mean below 0.25)", MOE, "below", "g1_elem_sig", metric="probe/gate_score_mean",
          level=0.25, paper_table="table4", paper_column="Gate Score",
          why="paper: 0.116 for G1, 0.653 for the non-sparse NS-sigmoid"),
    *(Claim(f"Gate score is higher for {v}", MOE, "higher", v, "g1_elem_sig", metric="probe/gate_score_mean",
            paper_table="table4", paper_column="Gate Score")
      for v in ("g1_elem_sig_shared", "g1_inputindep_sig", "g1_elem_nssig")),
    Claim("F-Attn (first-token attention) falls with the G1 gate (MoE)", MOE, "lower", "g1_elem_sig", "baseline",
          metric="probe/f_attn", paper_table="table4", paper_column="F-Attn"),
    Claim("F-Attn falls with the G1 gate (dense)", CORE, "lower", f"g1_elem_sig {BASE}", f"baseline {BASE}",
          metric="probe/f_attn", paper_table="table4", paper_column="F-Attn", why=MOE_FIGURE),
    Claim("M-Act (massive activations) falls with the G1 gate (MoE)", MOE, "lower", "g1_elem_sig", "baseline",
          metric="probe/m_act", paper_table="table4", paper_column="M-Act"),
    Claim("M-Act falls with the G1 gate (dense)", CORE, "lower", f"g1_elem_sig {BASE}", f"baseline {BASE}",
          metric="probe/m_act", paper_table="table4", paper_column="M-Act", why=MOE_FIGURE),
    Claim("M-Act falls with the G1 gate (dense, 4x the learning rate)", CORE, "lower", f"g1_elem_sig {HIGH}",
          f"baseline {HIGH}", metric="probe/m_act", paper_table="table4", paper_column="M-Act", why=MOE_FIGURE),
    Claim("4x the learning rate hurts the baseline", CORE, "higher", f"baseline {HIGH}", f"baseline {BASE}",
          paper_table="table2", paper_ids=("dense48_400b_baseline_lr8e-3", "dense48_400b_baseline_lr4e-3"),
          why="the paper doubles its rate (4e-3 to 8e-3); ours is 4x (2e-3 to 8e-3)"),
    Claim("The gated model tolerates 4x the learning rate better than the baseline", CORE, "smaller change",
          "g1_elem_sig", "baseline", setting=(BASE, HIGH),
          paper_text="48 layers, 4e-3 -> 8e-3: baseline 7.421 -> 9.195, gated 7.288 -> 7.325 (Table 2)",
          why="change of ln Avg PPL from the base rate to 4x, gated minus baseline, paired by seed"),
    Claim("Long-context perplexity degrades less with the gate (dense)", CORE, "lower", f"g1_elem_sig {BASE}",
          f"baseline {BASE}", metric="long_context_growth",
          why="ln(PPL beyond the training length at 8x / PPL at 1x); RoPE without YaRN"),
    Claim("Long-context perplexity degrades less with the gate (MoE)", MOE, "lower", "g1_elem_sig", "baseline",
          metric="long_context_growth", why="ln(PPL beyond the training length at 8x / PPL at 1x); RoPE without YaRN"),
    Claim("Our Table 1 ranks the variants like the paper's (Avg PPL)", MOE, "rank", "", rank_ids=TABLE1_ROWS,
          paper_table="table1"),
    Claim("Sink task: the baseline forms an attention sink (F-Attn on non-trigger queries above 0.25)", SINK, "above",
          "baseline", metric="bb/f_attn_other_queries", level=0.25,
          why="the precondition of the sink claims: a quarter of the attention on 1 of 64 tokens (uniform: 0.059); "
              "paper's baseline F-Attn: 0.467"),
    Claim("Sink task: F-Attn falls with the G1 elementwise gate", SINK, "lower", "g1_elem_sig", "baseline",
          metric="probe/f_attn", paper_table="table4", paper_column="F-Attn"),
    Claim("Sink task: F-Attn falls with the G1 headwise gate", SINK, "lower", "g1_head_sig", "baseline",
          metric="probe/f_attn", paper_table="table4", paper_column="F-Attn"),
    Claim("Sink task: M-Act falls with the G1 gate", SINK, "lower", "g1_elem_sig", "baseline", metric="probe/m_act",
          paper_table="table4", paper_column="M-Act"),
    Claim("Sink task: F-Attn ranks the gates like the paper's Table 4", SINK, "rank", "", metric="probe/f_attn",
          rank_ids=TABLE4_ROWS, paper_table="table4", paper_column="F-Attn"),
    *(Claim(f"Sink task: gate score is higher for {v}", SINK, "higher", v, "g1_elem_sig",
            metric="probe/gate_score_mean", paper_table="table4", paper_column="Gate Score")
      for v in ("g1_elem_sig_shared", "g1_inputindep_sig", "g1_elem_nssig")),
)


def _value(record: RunRecord, metric: str) -> float:
    if metric in DERIVED:
        return DERIVED[metric](record.metrics)
    return float(record.metrics.get(metric, math.nan))


def by_seed(records: Sequence[RunRecord], group: str, metric: str) -> dict[int, float]:
    """{seed: value} of a group's finished runs; a diverged run is NaN (no perplexity), other states are left out."""
    return {r.spec.experiment.seed: (_value(r, metric) if r.status == "finished" else math.nan)
            for r in records if r.group == group and r.status in ("finished", "diverged")}


def _interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% t-interval of the mean of `values` (n >= 2)."""
    low, high = scipy_stats.ttest_1samp(values, 0.0).confidence_interval(1 - ALPHA)
    return float(low), float(high)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _paper_figure(claim: Claim) -> tuple[str, float | None]:
    """The paper's figure for the claim, and its relative effect for perplexity comparisons (None otherwise)."""
    reference = paper_reference(claim.paper_table)
    column = claim.paper_column
    if claim.paper_text or claim.paper_table is None or column not in reference.columns:
        return claim.paper_text, None
    values = reference[column]
    a_id, b_id = claim.paper_ids or (claim.a.split(" ")[0], (claim.b or "").split(" ")[0])
    if claim.kind in ("below", "above"):
        return (f"{values[a_id]:g}" if a_id in values.index else ""), None
    if claim.kind == "rank" or a_id not in values.index or b_id not in values.index:
        return "", None
    a, b = float(values[a_id]), float(values[b_id])
    relative = (a - b) / b if column == "ppl" else None
    text = f"{a:g} vs {b:g}" + (f" ({100 * relative:+.1f}%)" if relative is not None else "")
    return text, relative


def _direction(claim: Claim, a: Mapping[int, float], b: Mapping[int, float], relative: bool,
               paper_relative: float | None) -> dict[str, str]:
    result = compare(a, b)
    scale = abs(mean_std(b.values())[0]) if relative else 1.0
    unit = "%" if relative else ""
    factor = 100.0 / scale if relative else 1.0
    expected = -1 if claim.kind in ("lower", "smaller change") else 1
    means = f" ({_fmt(mean_std(a.values())[0], 4)} vs {_fmt(mean_std(b.values())[0], 4)})"
    row = {"ours": f"{_fmt(result.delta * factor)}{unit}{means}",
           "spread (sd)": f"{_fmt(result.sd and result.sd * factor)}{unit}", "n": str(result.n),
           "p": _fmt(result.p_value) if result.p_value is not None else (result.reason or "n/a"),
           "MDE": f"{_fmt(result.mde and result.mde * factor)}{unit}"}
    if result.p_value is not None and result.p_value < ALPHA:
        row["verdict"] = HOLDS if np.sign(result.delta) == expected else f"{FAILS} (significant, the other way)"
    elif (paper_relative is not None and result.mde is not None and relative
          and result.mde / scale < abs(paper_relative)):
        row["verdict"] = f"{FAILS} (an effect of the paper's size would have been seen)"
    else:
        row["verdict"] = INCONCLUSIVE
    return row


def _groups(claim: Claim) -> list[str]:
    """The groups of runs a claim reads."""
    if claim.kind == "rank":
        return list(claim.rank_ids)
    if claim.kind == "smaller change":
        return [f"{group} {setting}" for group in (claim.a, claim.b) for setting in claim.setting]
    return [claim.a] + ([claim.b] if claim.b else [])


_EMPTY = {"ours": "", "spread (sd)": "", "n": "0", "p": "", "MDE": ""}


def _direction_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> dict[str, str]:
    """"lower"/"higher": the paired difference of the two groups against the paper's direction."""
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b, claim.metric)
    return _direction(claim, a, b, claim.metric == PPL, paper_relative)


def _smaller_change_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> dict[str, str]:
    """"smaller change": the paired difference-in-differences of ln perplexity between the two settings."""
    low, high = claim.setting
    change = {}
    for group in (claim.a, claim.b):
        before, after = by_seed(records, f"{group} {low}", PPL), by_seed(records, f"{group} {high}", PPL)
        # a run that diverged at the higher setting has risen without bound: its change is +inf, not missing
        change[group] = {s: (math.log(after[s] / before[s]) if math.isfinite(after[s]) else math.inf)
                         for s in before.keys() & after.keys() if math.isfinite(before[s])}
    diverged = {g: sum(math.isinf(v) for v in change[g].values()) for g in change}
    if diverged[claim.b] > diverged[claim.a]:
        return {"ours": f"diverged: {diverged[claim.a]} {claim.a}, {diverged[claim.b]} {claim.b}",
                "spread (sd)": "", "n": str(len(change[claim.a])), "p": "", "MDE": "", "verdict": HOLDS}
    finite = {g: {s: v for s, v in change[g].items() if math.isfinite(v)} for g in change}
    result = _direction(claim, finite[claim.a], finite[claim.b], False, None)
    result["ours"] += f" (nats; diverged {diverged[claim.a]} vs {diverged[claim.b]})"
    return result


def _close_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> dict[str, str]:
    """"close": the 95% interval of the paired difference against a margin from the G1 gain over baseline."""
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b, claim.metric)
    base = by_seed(records, claim.b.replace(claim.b.split(" ")[0], "baseline", 1), claim.metric)
    shared = sorted(s for s in a.keys() & b.keys() & base.keys() if all(math.isfinite(x[s]) for x in (a, b, base)))
    if len(shared) < 2:
        return _EMPTY | {"verdict": INCONCLUSIVE, "n": str(len(shared)), "note": "fewer than two seeds"}
    differences = np.array([a[s] - b[s] for s in shared])
    gain = abs(float(np.mean([b[s] - base[s] for s in shared])))
    margin = CLOSE_MARGIN * gain
    low, high = _interval(differences)
    scale = 100.0 / float(np.mean([b[s] for s in shared]))
    result = _direction(claim, {s: a[s] for s in shared}, {s: b[s] for s in shared}, claim.metric == PPL, None)
    result["ours"] += f" (95% CI {low * scale:+.2f}% to {high * scale:+.2f}%; margin +-{margin * scale:.2f}%)"
    result["verdict"] = (HOLDS if -margin < low and high < margin
                         else FAILS if low > margin or high < -margin else INCONCLUSIVE)
    return result


def _level_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> dict[str, str]:
    """"below"/"above": the 95% interval of the group's mean against the claimed level."""
    values = np.array([v for v in by_seed(records, claim.a, claim.metric).values() if math.isfinite(v)])
    if len(values) < 2:
        return _EMPTY | {"verdict": INCONCLUSIVE, "n": str(len(values)), "note": "fewer than two seeds"}
    low, high = _interval(values)
    result = {"ours": f"{np.mean(values):.3g} (95% CI {low:.3g} to {high:.3g})",
              "spread (sd)": _fmt(float(np.std(values, ddof=1))), "n": str(len(values)), "p": "", "MDE": ""}
    inside, outside = (high < claim.level, low > claim.level) if claim.kind == "below" else \
        (low > claim.level, high < claim.level)
    result["verdict"] = HOLDS if inside else FAILS if outside else INCONCLUSIVE
    return result


def _rank_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> dict[str, str]:
    """"rank": Kendall's tau of our group means against the paper's column."""
    ours = {v: mean_std(by_seed(records, v, claim.metric).values())[0] for v in claim.rank_ids}
    reference = paper_reference(claim.paper_table)
    paper = {v: float(reference[claim.paper_column][v]) for v in claim.rank_ids
             if v in reference.index and pd.notna(reference[claim.paper_column][v])}
    agreement = rank_agreement({k: v for k, v in ours.items() if math.isfinite(v)}, paper)
    tau, p = agreement.get("tau"), agreement.get("p_value")
    verdict = INCONCLUSIVE if tau is None or p is None or p >= ALPHA else HOLDS if tau > 0 else FAILS
    return {"ours": f"Kendall's tau {_fmt(tau)}", "spread (sd)": "", "n": str(agreement.get("n", 0)), "p": _fmt(p),
            "MDE": "", "verdict": verdict}


# How each kind of claim is tested: (claim, its sweep's records, the paper's relative effect) -> the row's figures.
CHECKS: dict[str, Callable[[Claim, Sequence[RunRecord], float | None], dict[str, str]]] = {
    "lower": _direction_claim,
    "higher": _direction_claim,
    "smaller change": _smaller_change_claim,
    "close": _close_claim,
    "below": _level_claim,
    "above": _level_claim,
    "rank": _rank_claim,
}


def evaluate_claim(claim: Claim, records: Sequence[RunRecord] | None) -> dict[str, str]:
    """One row of the claims table."""
    paper_text, paper_relative = _paper_figure(claim)
    comparison = claim.a if claim.b is None else f"{claim.a} vs {claim.b}"
    if claim.kind == "rank":
        comparison = f"{len(claim.rank_ids)} variants"
    row = {"claim": claim.claim, "sweep": claim.sweep, "comparison": comparison, "metric": claim.metric,
           "paper": paper_text}
    if not records:
        return row | _EMPTY | {"verdict": NOT_RUN, "note": claim.why}
    missing = [g for g in _groups(claim) if not by_seed(records, g, claim.metric)]
    if missing:
        return row | _EMPTY | {"verdict": NOT_RUN, "note": f"no ended runs of {', '.join(missing)}"}
    result = CHECKS[claim.kind](claim, records, paper_relative)
    return row | result | ({} if "note" in result else {"note": claim.why})


def claims_table(records_by_sweep: Mapping[str, Sequence[RunRecord]]) -> pd.DataFrame:
    """Every claim of `CLAIMS`, in order; a claim whose sweep is not given is marked "not run"."""
    return pd.DataFrame([evaluate_claim(c, records_by_sweep.get(c.sweep)) for c in CLAIMS])


VERDICT_RULES = [
    "Groups are compared paired by seed (runs of one seed share data order and initialisation); p: two-sided paired "
    "t-test; MDE: the smallest difference these seeds detect at p < 0.05 with 80% power; perplexity differences are "
    "% of the second group's mean.",
    "Direction claims hold at p < 0.05 the paper's way, do not hold at p < 0.05 the other way or, for perplexity, "
    "when the MDE is below the paper's own relative effect; otherwise inconclusive at this scale.",
    f"'Close': the 95% interval of the difference within +-{CLOSE_MARGIN:g} x the G1 elementwise gain over baseline. "
    "Levels: the 95% interval of the mean on the claimed side. Rank: Kendall's tau > 0 at p < 0.05.",
    "Paper: Qiu et al. 2025 (arXiv 2505.06708), Tables 1-4, numbers in results/paper/; its models are 15B MoE / 1.7B "
    "dense on 400B tokens, so compare directions, not magnitudes.",
]


def make_claims(sweep_paths: Sequence[Path], out_dir: Path, formats: Sequence[str], tracking_uri: str | None,
                runs_dir: Path, storage: str | None, command: str | None = None, log=print) -> list[Path]:
    """`gatelab claims`: the claims table of the given sweeps' runs, written as `claims.<format>` under `out_dir`."""
    from gatelab.report.export import ReportTable, check_formats, export_report
    from gatelab.report.tables import collect_runs, data_stamp
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep
    from gatelab.tracking import RunStore, default_tracking_uri

    check_formats(formats)
    store = RunStore(tracking_uri or default_tracking_uri(runs_dir), runs_dir)
    records: dict[str, list[RunRecord]] = {}
    for path in sweep_paths:
        sweep = load_sweep(path)
        specs = expand(sweep)
        records[sweep.name] = collect_runs(specs, store, sweep.name, ledger_states(storage, runs_dir, sweep.name, specs))
    known = {claim.sweep for claim in CLAIMS}
    unused = sorted(set(records) - known)
    if unused:
        log(f"no claim reads the sweep(s) {', '.join(unused)}; claims read {', '.join(sorted(known))}")
    frame = claims_table(records)
    missing = dict.fromkeys(note for c in CLAIMS for note in missing_note(c.paper_table))  # one note per file
    table = ReportTable("The paper's claims at tiny scale", frame, VERDICT_RULES + list(missing))
    written = export_report([table], [], out_dir, formats, "claims", command=command,
                            stamp=data_stamp([r for rs in records.values() for r in rs]))
    log(frame[["claim", "ours", "p", "verdict"]].to_string(index=False))
    return written
