"""Paper-shaped comparison tables from a sweep's MLflow runs, with the paper's numbers beside ours.

Rows are groups of runs that differ only in seed (a variant, plus any other swept keys). Seeds are aggregated as
mean ± std (n); each row is compared with the `baseline` row of the same settings, paired by seed (runs share data
order and initialisation) or with Welch's test when seeds do not pair. Runs that are missing, running, failed or
diverged are shown as such, never as numbers. Beside each row's effect stands its cost, the step-time ratio to the
baseline (gatelab.report.step_cost), where both ran on one host and one device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gatelab import metrics as catalogue
from gatelab import paper as paper_tables
from gatelab.progress import DEVICE_TAG, HOST_TAG
from gatelab.report.budgets import BUDGET_FIX, not_comparable
from gatelab.report.claims_file import group_name
from gatelab.report.stats import PAIRED, Comparison, compare, mean_std, rank_agreement, sign_agreement
from gatelab.report.step_cost import STEP_TIME_RATIO, StepCost, step_cost, step_cost_notes, values_by_seed
from gatelab.tracking import EVAL_BUDGET_PARAM, SPEC_HASH_TAG, STATUS_TAG, RunStore

PPL = catalogue.PPL_AVG
# The probes that tell "do-nothing" attention mechanisms apart (issue 33; gatelab.eval.probes and .quantization): Gu et
# al.'s sink rate, Bondarenko et al.'s kurtosis and largest |activation| of the blocks' outputs, and the perplexity
# under W8A8 fake quantisation with its ratio to full precision. The paper has no column for them.
OUTLIER_PROBES = (catalogue.SINK_RATE, catalogue.KURTOSIS_MAX, catalogue.MAX_ABS_ACTIVATION, catalogue.W8A8_PPL,
                  catalogue.W8A8_PPL_RATIO)


def paper_reference(paper: str | None) -> pd.DataFrame:
    """The paper's rows for a sweep's `paper:` key (or a claim's `paper.table`), indexed by the tables' own ids: `ppl`,
    Table 4's probe columns and the benchmark columns. The comparison reads them by variant id instead
    (`gatelab.paper.reference(paper, by_variant=True)`)."""
    return paper_tables.reference(paper)


ENDED = ("finished", "diverged")  # a run's final statuses whose metrics are read (a diverged run: uniform prediction)


@dataclass
class RunRecord:
    """One RunSpec and what became of it."""

    spec: Any
    status: str  # finished / diverged / pruned / running / pending / failed / missing
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    diverged_step: int | None = None
    ended: str | None = None  # MLflow's end time, "YYYY-MM-DD HH:MM:SS UTC"
    host: str | None = None  # HOST_TAG and DEVICE_TAG: where it ran (None for runs from before the tags)
    device: str | None = None
    budget: str | None = None  # EVAL_BUDGET_PARAM: what it was scored on (None before it: budgets.run_budget)

    @property
    def group(self) -> str:
        return group_name(self.spec.experiment.variant, self.spec.settings())

    @property
    def baseline_group(self) -> str:
        return group_name("baseline", self.spec.settings())


def collect_runs(specs, store: RunStore, sweep_name: str, ledger_states=None) -> list[RunRecord]:
    """Each spec with its MLflow run (matched by spec hash) and its status (the ledger's, where there is one).
    Superseded runs are never read: sweep_runs leaves them out, so a newer superseded run hides no finished one."""
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
        host, device = (None, None) if row is None else (_tag(row, HOST_TAG), _tag(row, DEVICE_TAG))
        budget = None if row is None else _text(row, f"params.{EVAL_BUDGET_PARAM}")
        records.append(RunRecord(spec, status, None if row is None else row["run_id"], metrics,
                                 int(step) if step is not None else None, ended, host, device, budget))
    return records


def _tag(row: pd.Series, name: str) -> str | None:
    """A run's tag, None where the store has no such column or this run lacks it (NaN)."""
    return _text(row, f"tags.{name}")


def _text(row: pd.Series, column: str) -> str | None:
    value = row.get(column)
    return value if isinstance(value, str) and value else None


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
    secondary: list[str] = field(default_factory=list)  # the frame's columns beyond the comparison itself
    rows: list[GroupNumbers] = field(default_factory=list)  # the frame's rows before formatting


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
    baseline_mean: float = math.nan  # the baseline's mean over the runs `comparison` set this group against
    step_cost: StepCost | None = None  # the step-time ratio to that baseline; None for baseline or without one
    # Set where the group's runs and its baseline's were scored on different evaluation budgets
    # (budgets.not_comparable): then nothing is compared, and `comparison` and `score_comparisons` stay empty.
    not_comparable: str | None = None

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

    @property
    def delta_percent(self) -> float:
        """The change against baseline as a share of the baseline: a tiny model's perplexity is two orders of magnitude
        above the paper's, so only relative changes compare with the paper's."""
        if self.variant == "baseline":
            return 0.0 if self.values else math.nan
        return 100 * self.delta / self.baseline_mean if self.baseline_mean else math.nan

    @property
    def paper_delta_percent(self) -> float:
        return 100 * self.paper_delta / (self.paper - self.paper_delta)


def _shown_metrics(records: list[RunRecord]) -> list[str]:
    """The metrics beside the main one, in table order: per-domain perplexity, bits per byte (mean over domains),
    long-context perplexity, BLiMP, the probes, M-Act's location (share of layers whose largest activation sits on
    token 0), the outlier probes, and a synthetic task's own metrics. One no run logged (runs before bits per byte,
    a synthetic task's) has no column."""
    domain_metrics = sorted({m for r in records for m in r.metrics if m.startswith("ppl/") and m != PPL})
    long_metrics = sorted({m for r in records for m in r.metrics if m.startswith("long_ppl/x")},
                          key=lambda m: int(m.rsplit("x", 1)[1]))
    extra = [catalogue.BLIMP_ACCURACY, *paper_tables.PROBE_METRICS.values(), catalogue.M_ACT_MAX_AT_FIRST_TOKEN,
             *OUTLIER_PROBES, *sorted({m for r in records for m in r.metrics if m.startswith("bb/")})]
    return domain_metrics + [catalogue.BPB_AVG] + long_metrics + extra + _benchmark_metrics(records)


def _benchmark_metrics(records: list[RunRecord]) -> list[str]:
    """lm-eval's scores the runs have (`gatelab eval`, or eval.lm_eval): `lm_eval/<task>/<metric>`, stderr aside."""
    return sorted({m for r in records for m in r.metrics if m.startswith("lm_eval/") and not m.endswith("/stderr")})


def comparison_numbers(records: list[RunRecord], reference: pd.DataFrame, metric: str = PPL) -> list[GroupNumbers]:
    """The comparison as numbers: one GroupNumbers per group, in the order the groups first appear."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.group, []).append(record)
    by_seed = {g: values_by_seed(rs, metric) for g, rs in groups.items()}
    paper_ppl = reference["ppl"] if "ppl" in reference else None
    paper_baseline = paper_ppl.get("baseline", math.nan) if paper_ppl is not None else math.nan
    shown = _shown_metrics(records)
    scores = [catalogue.BLIMP_ACCURACY, *_benchmark_metrics(records)]
    rows = []
    for group, members in groups.items():
        variant = members[0].spec.experiment.variant
        baseline_members = groups.get(members[0].baseline_group, [])
        apart = not_comparable(members + ([] if baseline_members is members else baseline_members))
        baseline = by_seed.get(members[0].baseline_group, {}) if apart is None else {}
        comparison = compare(by_seed[group], baseline) if variant != "baseline" and by_seed[group] and baseline \
            else None
        paper_value = paper_ppl.get(variant, math.nan) if paper_ppl is not None else math.nan
        paper_probes = {c: reference[c].get(variant, math.nan) for c in paper_tables.PROBE_METRICS
                        if c in reference.columns}
        extra = {name: [r.metrics[name] for r in members if r.status == "finished" and name in r.metrics]
                 for name in shown}
        score_comparisons = {}
        if variant != "baseline" and apart is None:
            for name in scores:
                ours, base = values_by_seed(members, name), values_by_seed(baseline_members, name)
                if ours and base:
                    score_comparisons[name] = compare(ours, base)
        # The paper's benchmark columns stand beside benchmark scores of ours: without any they would only widen the
        # table.
        paper_benchmarks = {c: reference[c].get(variant, math.nan) for c in paper_tables.BENCHMARK_TASKS
                            if c in reference.columns and len(scores) > 1}
        cost = step_cost(members, baseline_members) if variant != "baseline" and baseline_members else None
        rows.append(GroupNumbers(group, variant, members, list(by_seed[group].values()), comparison, paper_value,
                                 paper_value - paper_baseline, paper_probes, {k: v for k, v in extra.items() if v},
                                 score_comparisons, paper_benchmarks, _baseline_mean(comparison, by_seed[group],
                                                                                     baseline), cost, apart))
    return rows


def _baseline_mean(comparison: Comparison | None, variant: dict[int, float], baseline: dict[int, float]) -> float:
    """The baseline's mean over the runs `compare` used: the seeds both sides have where it paired them, else all."""
    if comparison is None:
        return math.nan
    finite = {seed: value for seed, value in baseline.items() if math.isfinite(value)}
    if comparison.test == PAIRED:
        finite = {seed: value for seed, value in finite.items() if math.isfinite(variant.get(seed, math.nan))}
    return sum(finite.values()) / len(finite) if finite else math.nan


def numbers_frame(rows: list[GroupNumbers]) -> pd.DataFrame:
    """The numbers of each group, indexed by group: id, n, settings, mean, delta (and in %), paper, paper_delta (and
    in %)."""
    return pd.DataFrame([{"variant": r.group, "id": r.variant, "n": len(r.values), "settings": r.settings,
                          "mean": r.mean, "delta": r.delta, "delta_percent": r.delta_percent, "paper": r.paper,
                          "paper_delta": r.paper_delta, "paper_delta_percent": r.paper_delta_percent}
                         for r in rows]).set_index("variant")


ONE_SEED_TEST = "n/a (1 seed)"
TEST_COLUMNS = ("Δ vs baseline", "Δ (%)", "p", "test", STEP_TIME_RATIO, "MDE (p<0.05)", "seeds needed")
PAPER_COLUMNS = ("paper Avg PPL", "paper Δ", "paper Δ (%)")


def _one_seed(result: Comparison) -> bool:
    """One run on a side: no spread to test against, so no test was run (`compare` says why in `reason`)."""
    return result.p_value is None and result.n == 1


def format_comparison(rows: list[GroupNumbers], metric: str = PPL) -> pd.DataFrame:
    """The main table as text: one row per group, ours beside the paper's, deltas with their significance."""
    lines = []
    for number in rows:
        variant, result = number.variant, number.comparison
        line: dict[str, Any] = {"variant": number.group, "runs": _status_text(number.members)}
        line[f"{metric} (mean ± std (n))"] = _cell(number.values) if number.values else number.members[0].status
        if result is not None:
            line["Δ vs baseline"] = f"{result.delta:+.3f}"
            line["Δ (%)"] = _percent(number.delta_percent)
            if _one_seed(result):
                line["p"], line["test"] = "", ONE_SEED_TEST
            else:
                line["p"] = f"{result.p_value:.3g}" if result.p_value is not None else (result.reason or "n/a")
                line["test"] = result.test
            line[STEP_TIME_RATIO] = "n/a"
            line["MDE (p<0.05)"] = f"{result.mde:.3f}" if result.mde is not None else "n/a"
            line["seeds needed"] = str(result.seeds_needed) if result.seeds_needed is not None else "n/a"
        else:
            for column in TEST_COLUMNS:
                line[column] = "" if variant == "baseline" else "n/a"
            if number.not_comparable is not None:
                line["Δ vs baseline"] = number.not_comparable
        if number.step_cost is not None:
            line[STEP_TIME_RATIO] = number.step_cost.cell
        line["paper Avg PPL"] = "" if math.isnan(number.paper) else f"{number.paper:.3f}"
        paper_delta = number.paper_delta
        shown = not math.isnan(paper_delta) and variant != "baseline"
        line["paper Δ"] = f"{paper_delta:+.3f}" if shown else ""
        line["paper Δ (%)"] = _percent(number.paper_delta_percent) if shown else ""
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


def _percent(value: float) -> str:
    return "" if math.isnan(value) else f"{value:+.2f}"


def _agreement(rows: list[GroupNumbers], reference: pd.DataFrame) -> tuple[dict[str, Any], str]:
    """Rank and sign agreement with the paper, and the settings of the rows they use.

    The paper has one row per variant: they use the rows of the first group's settings (e.g. the base learning
    rate), never a mix of one variant's settings."""
    ranked_settings = rows[0].settings if rows else ""
    ranked = [r for r in rows if r.settings == ranked_settings]
    ours = {r.variant: r.mean for r in ranked if not math.isnan(r.mean)}
    paper_values = {i: v for i, v in reference["ppl"].items() if not math.isnan(v)} if "ppl" in reference else {}
    apart = not_comparable([member for r in ranked for member in r.members])  # a rank compares every row's mean
    return {
        "rank": rank_agreement(ours, paper_values) if apart is None else {"tau": None, "reason": apart},
        "sign": sign_agreement({r.variant: r.delta for r in ranked}, {r.variant: r.paper_delta for r in ranked}),
    }, ranked_settings


def comparison_notes(rows: list[GroupNumbers], agreement: dict[str, Any], ranked_settings: str, paper: str | None,
                     metric: str = PPL) -> list[str]:
    """The lines under the main table: the test used, agreement with the paper, where the paper's figures come from."""
    compared = [r.comparison for r in rows if r.comparison is not None]
    tests_used = {c.test for c in compared if not _one_seed(c)}
    notes = []
    if tests_used:
        notes.append("Significance: " + " and ".join(sorted(tests_used)) + " test of each row's "
                     f"{metric} against baseline over seeds (paired by seed where the seeds match: runs of one seed "
                     "share data order and initialisation). MDE: the smallest difference these seeds could detect "
                     "at p < 0.05 with 80% power; seeds needed: for the observed difference.")
    if any(_one_seed(c) for c in compared):
        notes.append(f"Test '{ONE_SEED_TEST}': a row or its baseline has one run, so there is no spread to test the "
                     "difference against; add seeds to the sweep's grid (seed: [0, 1, 2]) for a p-value.")
    notes.append("Δ (%): the change against baseline as a share of the baseline's value. A small model's perplexity "
                 "can be orders of magnitude above the paper's, so compare these shares and their signs with the "
                 "paper's, not the absolute values.")
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
        standing = paper_tables.rows_standing_for_variants(paper)
        notes.append(f"Paper columns: Qiu et al. 2025, {paper_tables.title(paper)}, from results/paper/"
                     + (f" ({'; '.join(standing)})" if standing else "") + ".")
        notes += model_kind_notes(rows, paper)
        notes += paper_tables.missing_note(paper)
    return notes


MODEL_KIND_NAMES = {"dense": "dense", "moe": "MoE"}


def model_kinds(records: Sequence[RunRecord]) -> list[str]:
    """The kinds of model ("dense", "moe": experiment.model.ffn) the runs train, in the order they first appear."""
    return list(dict.fromkeys(r.spec.experiment.model.ffn for r in records))


def _kinds_text(kinds) -> str:
    return " and ".join(MODEL_KIND_NAMES.get(k, k) for k in sorted(kinds))


def model_kind_notes(rows: list[GroupNumbers], paper: str) -> list[str]:
    """A note where the sweep trains another kind of model (dense or MoE) than the paper's table it names: its columns
    then come from another architecture, which a reader has to know."""
    ours, theirs = model_kinds([r for row in rows for r in row.members]), paper_tables.model_kinds(paper)
    if not theirs or set(ours) <= theirs:
        return []
    fitting = [key for key in paper_tables.SWEEP_TABLES if set(ours) == paper_tables.model_kinds(key)]
    fix = (f"; for the paper's {_kinds_text(ours)} numbers name paper: {' or '.join(fitting)} in the sweep file"
           if fitting else "")
    return [f"Model kind differs: this sweep trains {_kinds_text(ours)} models (experiment.model.ffn) but the paper's "
            f"{paper_tables.title(paper)} is of {_kinds_text(theirs)} models, so its columns come from another "
            f"architecture{fix}."]


# Both score one domain at the training length, on different text: a reader comparing the two columns needs this.
LONG_PPL_NOTE = ("long_ppl/x<m>: the same prefix (the largest multiplier times the training length) of up to 16 "
                 "long held-out documents at every multiplier, cut into windows of m x the training length; "
                 "long_ppl/x1 therefore differs from ppl/<its domain>, which scores up to "
                 "eval.max_windows_per_domain windows spread over the domain's whole held-out split.")


def comparison_title(sweep_name: str, records: Sequence[RunRecord], paper: str | None, metric: str = PPL) -> str:
    """The main table's title: what it compares, on which kind of model, beside which of the paper's tables."""
    kinds = model_kinds(records)
    title = f"{sweep_name}: {metric} by variant" + (f" ({_kinds_text(kinds)} model)" if kinds else "")
    return title + (f", beside the paper's {paper_tables.title(paper)}" if paper_tables.title(paper) else "")


def build_comparison(records: list[RunRecord], paper: str | None, metric: str = PPL) -> ComparisonResult:
    """The main table: one row per group, ours beside the paper's, deltas with their significance."""
    reference = paper_tables.reference(paper, by_variant=True)
    rows = comparison_numbers(records, reference, metric)
    agreement, ranked_settings = _agreement(rows, reference)
    frame = format_comparison(rows, metric)
    main = {"variant", "runs", f"{metric} (mean ± std (n))", *TEST_COLUMNS, *PAPER_COLUMNS}
    notes = comparison_notes(rows, agreement, ranked_settings, paper, metric)
    notes += step_cost_notes({r.group: r.step_cost for r in rows if r.step_cost is not None})
    apart = [r.group for r in rows if r.not_comparable is not None]
    if apart:
        notes.append(f"{BUDGET_FIX} Not compared here: {', '.join(apart)}.")
    if catalogue.LONG_PPL.format(multiplier=1) in frame.columns:
        notes.append(LONG_PPL_NOTE)
    return ComparisonResult(frame, numbers_frame(rows), notes, agreement, [c for c in frame.columns if c not in main],
                            rows)


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
