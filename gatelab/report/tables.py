"""Paper-shaped comparison tables from a sweep's MLflow runs, with the paper's numbers beside ours.

Rows are groups of runs that differ only in seed (a variant, plus any other swept keys). Seeds are aggregated as
mean ± std (n); each row is compared with the `baseline` row of the same settings, paired by seed (runs share data
order and initialisation) or with Welch's test when seeds do not pair. Runs that are missing, running, failed or
diverged are shown as such, never as numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import pandas as pd

from gatelab import paper as paper_tables
from gatelab.report.stats import Comparison, compare, mean_std, rank_agreement, sign_agreement
from gatelab.tracking import SPEC_HASH_TAG, STATUS_TAG, RunStore

# The paper's columns that our probes measure (Table 4), as gatelab.paper registers them.
PAPER_PROBES = paper_tables.PROBE_METRICS
PAPER_BENCHMARKS = paper_tables.BENCHMARK_TASKS
PPL = "ppl/avg"


def paper_reference(paper: str | None) -> pd.DataFrame:
    """The paper's rows for a sweep's `paper:` key, indexed by variant id: `ppl` and Table 4's probe columns."""
    return paper_tables.reference(paper)


@dataclass
class RunRecord:
    """One RunSpec and what became of it."""

    spec: Any
    status: str  # finished / diverged / pruned / running / pending / failed / missing
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    diverged_step: int | None = None
    ended: str | None = None  # MLflow's end time, "YYYY-MM-DD HH:MM:SS UTC"

    @property
    def group(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in sorted(self.spec.settings().items()))
        return f"{self.spec.experiment.variant}{' ' + settings if settings else ''}"

    @property
    def baseline_group(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in sorted(self.spec.settings().items()))
        return f"baseline{' ' + settings if settings else ''}"


def collect_runs(specs, store: RunStore, sweep_name: str, ledger_states=None) -> list[RunRecord]:
    """Each spec with its MLflow run (matched by spec hash) and its status (the ledger's, where there is one)."""
    runs = store.sweep_runs(sweep_name)
    by_hash = {}
    for _, row in runs.iterrows():
        by_hash.setdefault(row[f"tags.{SPEC_HASH_TAG}"], row)  # the newest run of each spec
    states = {state.hash: state for state in (ledger_states or [])}
    records = []
    for spec in specs:
        row = by_hash.get(spec.hash)
        state = states.get(spec.hash)
        status = "missing"
        if row is not None:
            tagged = row.get(f"tags.{STATUS_TAG}")
            status = tagged if isinstance(tagged, str) and tagged else "running"
            if row["status"] in ("FAILED", "KILLED"):
                status = "failed"
        if state is not None and state.status in ("pending", "running", "failed") and status not in ("finished",):
            status = state.status
        metrics = {}
        if row is not None:
            metrics = {c[len("metrics."):]: row[c] for c in runs.columns
                       if c.startswith("metrics.") and pd.notna(row[c])}
        step = metrics.get("diverged_step")
        ended = None if row is None or pd.isna(row.get("end_time")) else \
            pd.Timestamp(row["end_time"]).strftime("%Y-%m-%d %H:%M:%S UTC")
        records.append(RunRecord(spec, status, None if row is None else row["run_id"], metrics,
                                 int(step) if step is not None else None, ended))
    return records


def data_stamp(records: Sequence[RunRecord]) -> str:
    """What a report was made from, in words that stay the same when it is made again from the same store."""
    ended = [r.ended for r in records if r.ended]
    return f"from {len(ended)} ended runs, the last ended {max(ended)}" if ended else "from no ended runs"


def _cell(values: list[float], digits: int = 3) -> str:
    mean, std, n = mean_std(values)
    if n == 0:
        return ""
    return f"{mean:.{digits}f} ± {std:.{digits}f} ({n})" if std is not None else f"{mean:.{digits}f} (1)"


def _status_text(records: list[RunRecord]) -> str:
    counts: dict[str, int] = {}
    for record in records:
        label = f"diverged@{record.diverged_step}" if record.status == "diverged" else record.status
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items())


@dataclass
class ComparisonResult:
    frame: pd.DataFrame  # formatted strings, one row per group
    numbers: pd.DataFrame  # the same rows as numbers, for plots and exports
    notes: list[str]
    agreement: dict[str, Any]


@dataclass
class GroupNumbers:
    """One row of the comparison before formatting: a group's runs, its figures and the paper's."""

    group: str  # the variant plus any other swept keys
    variant: str
    members: list[RunRecord]
    values: list[float]  # the compared metric, one per finished seed
    comparison: Comparison | None  # against the baseline of the same settings; None for baseline or no data
    paper: float  # the paper's perplexity for this variant (NaN where it has none)
    paper_delta: float  # ... minus the paper's baseline
    paper_probes: dict[str, float]  # Table 4 column -> the paper's value, for the columns the reference has
    extra: dict[str, list[float]]  # further metrics shown in the table -> their finished values
    # Benchmark scores (BLiMP, lm-eval) against the baseline of the same settings, as the main metric is compared.
    score_comparisons: dict[str, Comparison] = field(default_factory=dict)
    paper_benchmarks: dict[str, float] = field(default_factory=dict)  # the paper's benchmark column -> its value

    @property
    def settings(self) -> str:
        return self.group[len(self.variant):].strip()

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    @property
    def delta(self) -> float:
        if self.comparison is not None:
            return self.comparison.delta
        return 0.0 if self.variant == "baseline" and self.values else math.nan


def _shown_metrics(records: list[RunRecord]) -> list[str]:
    """The metrics beside the main one, in table order: per-domain and long-context perplexity, BLiMP, the probes,
    M-Act's location (share of layers whose largest activation sits on token 0), and a synthetic task's own metrics."""
    domain_metrics = sorted({m for r in records for m in r.metrics if m.startswith("ppl/") and m != PPL})
    long_metrics = sorted({m for r in records for m in r.metrics if m.startswith("long_ppl/x")},
                          key=lambda m: int(m.rsplit("x", 1)[1]))
    extra = ["blimp/accuracy", *PAPER_PROBES.values(), "probe/m_act_share_layers_max_at_first_token",
             *sorted({m for r in records for m in r.metrics if m.startswith("bb/")})]
    return domain_metrics + long_metrics + extra + _benchmark_metrics(records)


def _benchmark_metrics(records: list[RunRecord]) -> list[str]:
    """lm-eval's scores the runs have (`gatelab eval`, or eval.lm_eval): `lm_eval/<task>/<metric>`, stderr aside."""
    return sorted({m for r in records for m in r.metrics if m.startswith("lm_eval/") and not m.endswith("/stderr")})


def comparison_numbers(records: list[RunRecord], reference: pd.DataFrame, metric: str = PPL) -> list[GroupNumbers]:
    """The comparison as numbers: one GroupNumbers per group, in the order the groups first appear."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.group, []).append(record)
    by_seed = {g: {r.spec.experiment.seed: r.metrics[metric] for r in rs if r.status == "finished" and metric in r.metrics}
               for g, rs in groups.items()}
    paper_ppl = reference["ppl"] if "ppl" in reference else None
    paper_baseline = paper_ppl.get("baseline", math.nan) if paper_ppl is not None else math.nan
    shown = _shown_metrics(records)
    scores = ["blimp/accuracy", *_benchmark_metrics(records)]
    rows = []
    for group, members in groups.items():
        variant = members[0].spec.experiment.variant
        baseline = by_seed.get(members[0].baseline_group, {})
        comparison = compare(by_seed[group], baseline) if variant != "baseline" and by_seed[group] and baseline \
            else None
        paper_value = paper_ppl.get(variant, math.nan) if paper_ppl is not None else math.nan
        paper_probes = {c: reference[c].get(variant, math.nan) for c in PAPER_PROBES if c in reference.columns}
        extra = {name: [r.metrics[name] for r in members if r.status == "finished" and name in r.metrics]
                 for name in shown}
        score_comparisons = {}
        if variant != "baseline":
            for name in scores:
                ours, base = _by_seed(members, name), _by_seed(groups.get(members[0].baseline_group, []), name)
                if ours and base:
                    score_comparisons[name] = compare(ours, base)
        # The paper's benchmark columns stand beside benchmark scores of ours: without any they would only widen the table.
        paper_benchmarks = {c: reference[c].get(variant, math.nan) for c in PAPER_BENCHMARKS
                            if c in reference.columns and len(scores) > 1}
        rows.append(GroupNumbers(group, variant, members, list(by_seed[group].values()), comparison, paper_value,
                                 paper_value - paper_baseline, paper_probes, {k: v for k, v in extra.items() if v},
                                 score_comparisons, paper_benchmarks))
    return rows


def _by_seed(members: list[RunRecord], metric: str) -> dict[int, float]:
    return {r.spec.experiment.seed: r.metrics[metric] for r in members if r.status == "finished" and metric in r.metrics}


def numbers_frame(rows: list[GroupNumbers]) -> pd.DataFrame:
    """The numbers of each group, indexed by group: id, n, settings, mean, delta, paper, paper_delta."""
    return pd.DataFrame([{"variant": r.group, "id": r.variant, "n": len(r.values), "settings": r.settings,
                          "mean": r.mean, "delta": r.delta, "paper": r.paper, "paper_delta": r.paper_delta}
                         for r in rows]).set_index("variant")


def format_comparison(rows: list[GroupNumbers], metric: str = PPL) -> pd.DataFrame:
    """The main table as text: one row per group, ours beside the paper's, deltas with their significance."""
    lines = []
    for number in rows:
        variant, result = number.variant, number.comparison
        line: dict[str, Any] = {"variant": number.group, "runs": _status_text(number.members)}
        line[f"{metric} (mean ± std (n))"] = _cell(number.values) if number.values else number.members[0].status
        if result is not None:
            line["Δ vs baseline"] = f"{result.delta:+.3f}"
            line["p"] = f"{result.p_value:.3g}" if result.p_value is not None else (result.reason or "n/a")
            line["test"] = result.test
            line["MDE (p<0.05)"] = f"{result.mde:.3f}" if result.mde is not None else "n/a"
            line["seeds needed"] = str(result.seeds_needed) if result.seeds_needed is not None else "n/a"
        else:
            for column in ("Δ vs baseline", "p", "test", "MDE (p<0.05)", "seeds needed"):
                line[column] = "" if variant == "baseline" else "n/a"
        line["paper Avg PPL"] = "" if math.isnan(number.paper) else f"{number.paper:.3f}"
        paper_delta = number.paper_delta
        line["paper Δ"] = "" if math.isnan(paper_delta) or variant == "baseline" else f"{paper_delta:+.3f}"
        for column, paper_probe in number.paper_probes.items():
            line[f"paper {column}"] = "" if pd.isna(paper_probe) else f"{paper_probe:g}"
        for name, values in number.extra.items():
            line[name] = _cell(values)
            if name in number.score_comparisons:
                score = number.score_comparisons[name]
                p_value = f"p {score.p_value:.3g}" if score.p_value is not None else (score.reason or "p n/a")
                line[f"{name} Δ"] = f"{score.delta:+.3f} ({p_value})"
        for column, paper_score in number.paper_benchmarks.items():
            line[f"paper {column}"] = "" if pd.isna(paper_score) else f"{paper_score:g}"
        lines.append(line)
    return pd.DataFrame(lines).fillna("")


def _agreement(rows: list[GroupNumbers], reference: pd.DataFrame) -> tuple[dict[str, Any], str]:
    """Rank and sign agreement with the paper, and the settings of the rows they use.

    The paper has one row per variant: they use the rows of the first group's settings (e.g. the base learning
    rate), never a mix of one variant's settings."""
    ranked_settings = rows[0].settings if rows else ""
    ranked = [r for r in rows if r.settings == ranked_settings]
    ours = {r.variant: r.mean for r in ranked if not math.isnan(r.mean)}
    paper_values = {i: v for i, v in reference["ppl"].items() if not math.isnan(v)} if "ppl" in reference else {}
    return {
        "rank": rank_agreement(ours, paper_values),
        "sign": sign_agreement({r.variant: r.delta for r in ranked}, {r.variant: r.paper_delta for r in ranked}),
    }, ranked_settings


def comparison_notes(rows: list[GroupNumbers], agreement: dict[str, Any], ranked_settings: str, paper: str | None,
                     metric: str = PPL) -> list[str]:
    """The lines under the main table: the test used, agreement with the paper, where the paper's figures come from."""
    tests_used = {r.comparison.test for r in rows if r.comparison is not None}
    notes = []
    if tests_used:
        notes.append("Significance: " + " and ".join(sorted(tests_used)) + " test of each row's "
                     f"{metric} against baseline over seeds (paired by seed where the seeds match: runs of one seed "
                     "share data order and initialisation). MDE: the smallest difference these seeds could detect "
                     "at p < 0.05 with 80% power; seeds needed: for the observed difference.")
    rank = agreement["rank"]
    if rank.get("tau") is not None:
        notes.append(f"Rank agreement with the paper on Avg PPL: Kendall's tau {rank['tau']:.3f} "
                     f"(p = {rank['p_value']:.3g}, n = {rank['n']})"
                     + (f", over the rows with {ranked_settings}." if ranked_settings else "."))
    elif paper:
        notes.append(f"Rank agreement with the paper: not computed ({rank.get('reason', 'too few rows')}).")
    sign = agreement["sign"]
    if sign.get("n"):
        notes.append(f"Sign agreement: {sign['fraction']:.0%} of {sign['n']} rows move against baseline the way the "
                     "paper's do" + (f" (rows with {ranked_settings})." if ranked_settings else "."))
    if paper:
        notes.append(f"Paper columns: Qiu et al. 2025, {paper} (results/paper/); the paper trains 15B MoE / 1.7B dense "
                     "models on 400B+ tokens, so compare directions and ranks, not absolute values.")
        notes += paper_tables.missing_note(paper)
    return notes


def build_comparison(records: list[RunRecord], paper: str | None, metric: str = PPL) -> ComparisonResult:
    """The main table: one row per group, ours beside the paper's, deltas with their significance."""
    reference = paper_reference(paper)
    rows = comparison_numbers(records, reference, metric)
    agreement, ranked_settings = _agreement(rows, reference)
    return ComparisonResult(format_comparison(rows, metric), numbers_frame(rows),
                            comparison_notes(rows, agreement, ranked_settings, paper, metric), agreement)


def probe_payloads(records: list[RunRecord], store: RunStore) -> dict[str, dict]:
    """Per group, the probes.json of its first finished run (per-layer F-Attn, gate histograms)."""
    payloads = {}
    for record in records:
        if record.status != "finished" or record.group in payloads or record.run_id is None:
            continue
        payload = store.artifact_json(record.run_id, "eval/probes.json")
        if payload is not None:  # an artifact store that cannot be read is a missing plot, not a failed table
            payloads[record.group] = payload
    return payloads
