"""`gatelab claims` in words and files: the verdict rules in words (printed under the table), the paragraph that
results/tiny/README.md opens with (made from the same table, so that its counts and q-values cannot drift from it), and
the files written."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from gatelab.metrics import INIT_SCALE
from gatelab.paper import missing_note
from gatelab.report.claims import (
    CONFOUNDED,
    DESCRIPTIVE,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_ADDRESSED,
    NOT_RUN,
    NOT_TESTABLE,
    TRUE_BY_CONSTRUCTION,
    claims_table,
    inconclusive,
)
from gatelab.report.claims_checks import BOOTSTRAP_RESAMPLES, INIT_SCALE_RATIO
from gatelab.report.claims_evidence import LOSS_SPIKES, SPIKE_SIGMAS
from gatelab.report.claims_file import Claim
from gatelab.report.claims_ladder import MULTIPLIER_RULE
from gatelab.report.claims_rules import COMMENSURATE, CORRECTION_NAMES, SECTIONS, Regime
from gatelab.report.tables import RunRecord

# Printed under the claims table: every rule of gatelab.report.claims, in words.
VERDICT_RULES = [
    "Seeds and test: a row compares two groups over the seeds both ended (shared seeds), and its means are over those "
    "seeds. Every sweep crosses its variants with the same seeds, and runs of one seed share data order and "
    "initialisation (common random numbers): the design pairs them, so every two-group row's test is the paired "
    "t-test (column test), fixed before any run and whatever the values. Welch's test would serve only groups without "
    "seed pairs; no sweep here has such groups, so no row uses it. Fewer than two shared seeds: no test. Column r "
    "(Pearson's r of the two groups over the shared seeds) describes the pairing and chooses nothing. Perplexity "
    "differences and their 95% intervals are % of the second group's mean.",
    "Sections (column section): confirmatory rows were committed to the claims file before the first run they read "
    "(a test compares the dates); exploratory rows test the paper's claims but were written after their data; other "
    "papers' rows test Gu et al. 2025 or Bondarenko et al. 2023. Each section is its own family: p (two-sided) is "
    "corrected by Holm over the confirmatory rows and by Benjamini-Hochberg over each other section (column q); "
    "verdicts are decided on q < 0.05. Rows without a p-value are in no family. A confirmatory row is read only once "
    "every run it declared has ended (rule: whole sample): a sweep run in parts shows no figure of it before then, "
    "so no interim look can stop it early.",
    "Rule (column rule): the rule that gave the row its verdict: its own test (q < 0.05, or no decision at "
    "q >= 0.05), the paper's size (the interval against the paper's effects), the margin (the interval beyond it), "
    "the init scale, the regime, a positive control, a precondition, the evaluation budget, the whole sample; columns "
    "init ratio and regime give the figures those rules read.",
    "Direction (paired t): holds at q < 0.05 the paper's way; does not hold at q < 0.05 the other way; for "
    "perplexity, does not hold (the paper's size excluded) when the 95% interval of our relative difference lies "
    "wholly on the near side of every effect the paper reports for the sweep's kind of model (Table 2 for a dense "
    "sweep, Tables 1, 3 and 4 for an MoE one; the paper column gives the figure and the note says which one the "
    "interval is compared with), and never where the paper has no figure for that kind of model; otherwise "
    "inconclusive at this scale, with the way our figures point (the paper's direction, or the other way). The MDE "
    "(80% power at p < 0.05) describes the test and decides nothing. Change (paired t on each seed's change of the "
    "metric between two settings): the same, without the paper's size.",
    f"Init scale: a row comparing two groups (direction, closeness, change, LR sensitivity) whose mean {INIT_SCALE} "
    f"(the attention sublayer's output RMS at step 0, mean over layers) are in a ratio (column init ratio) outside "
    f"[{INIT_SCALE_RATIO[0]:g}, {INIT_SCALE_RATIO[1]:g}] is init-scale confounded, whichever way its test points (the "
    "note gives what the test alone says), unless it would hold and names a scale-matched control row (a direction "
    "row about the same group against one that starts at its scale) that holds. Where the runs do not log the metric "
    "the rule cannot be applied, and the row's note says so.",
    f"Regime: a statement of size (a closeness, \"the paper's size excluded\") is read only in a sweep whose reference "
    f"row (G1 against the baseline) moves perplexity by 1/{COMMENSURATE:g} to {COMMENSURATE:g} times the paper's mean "
    "effect for the sweep's kind of model (column regime); "
    "elsewhere, or in a sweep without a reference row, such a row is not testable at this scale (a closeness is then "
    "not tested; a direction row keeps its test, and only its size is not read).",
    "Closeness (TOST, paired t; also where the paper reports no difference): two one-sided tests of the difference "
    "within +-margin, as a share of the second group's mean (the note names it). Margins are never from our runs: "
    "twice the paper's own gap for the same pair (so that the paper's own result lies at half the margin), or a stated "
    "margin with its reason and a positive control, two groups of the same sweep whose difference must exceed the "
    "margin (paired t, p < 0.05), else the sweep tells nothing that size apart and the row is not testable; holds at "
    "q < 0.05, does not hold when the 95% interval lies beyond the margin, otherwise inconclusive.",
    "Level (one-sample t): the mean against the level; holds at q < 0.05 on the claimed side, does not hold at "
    "q < 0.05 on the other. Rank (Kendall tau): our means against the paper's, holds at q < 0.05 with tau > 0; "
    f"also within the gated rows only, with a 95% bootstrap interval over seeds ({BOOTSTRAP_RESAMPLES} resamples, "
    "fixed seed).",
    "LR sensitivity (Wortsman et al. 2023; paired t): per seed, the mean over the grid of rates of min(final "
    "val/loss, ln vocab) minus its lowest; compared like a change. Stable rate: the highest rate at which no run "
    "diverged or ended at or above ln vocab; descriptive, not tested.",
    "Diverged runs count in both groups, as the worst value: the loss (ln vocab) or perplexity (vocab) of uniform "
    "prediction; a probe has no worst value, so its diverged runs are left out and counted in the note.",
    "Not testable at this scale: a condition the claim needs did not arise in these runs (no attention sink, no "
    "massive activation, gate scores not moved from init, no instability at any rate), answered once a sweep for the "
    "rows that share it; the row's note states the rule, its threshold and what was measured. Such rows, rows true by "
    "construction (shown with the reason) and "
    "descriptive rows get no p-value, are not in the Benjamini-Hochberg family, and count neither for nor against "
    "the paper.",
    "Evaluation budget: a row whose runs were scored on different evaluation budgets (param resolved.eval.budget: "
    "the held-out text the end-of-run scores read) is not testable, and no regime is read from such a reference row; "
    "the note names the budgets.",
    "Not addressed: a claim of the paper no sweep here tests (what is missing is in the note); shown so that the "
    "table's silence is not read as support, and outside the count and the correction.",
    f"Loss spikes (metric {LOSS_SPIKES}): counted per run on the logged train/loss after warmup, a spike being a rise "
    f"between logged steps above {SPIKE_SIGMAS:g} x the noise of such rises in the same sweep's baseline runs "
    "(1.4826 x their median absolute deviation); compared like any metric. App. A.3 sparsity (metric "
    "sparsity_over_mean_gate): the share of gated SDPA output values below 1e-2 minus that of the ungated output "
    "scaled by the layer's mean gate score, per run.",
    "Paper: Qiu et al. 2025 (arXiv 2505.06708), Tables 1-4, numbers in results/paper/; its models are 15B MoE / 1.7B "
    "dense on 400B tokens or more: directions are compared everywhere, sizes only where the regime rule allows.",
]


# The paper's dense models: 1.7B parameters on 400B to 3.5T tokens (Table 2's blocks).
PAPER_DENSE_PARAMETERS, PAPER_DENSE_TOKENS = 1.7e9, (400e9, 3.5e12)


def tokens_per_parameter(records_by_sweep: Mapping[str, Sequence[RunRecord]],
                         logged_parameters: Callable[[str], int | None]) -> list[tuple[str, float]]:
    """(sweep, training tokens per parameter of its baseline: max_steps x batch_size x seq_len over the parameter count
    a baseline run logged, `logged_parameters(run_id)`) for each sweep with such a run; a sweep without a baseline reads
    its other runs."""
    regimes = []
    for sweep, records in records_by_sweep.items():
        model_runs = [r for r in records if r.spec.experiment.variant == "baseline"] or records
        counted = next(((r, n) for r in model_runs if r.run_id and (n := logged_parameters(r.run_id))), None)
        if counted is None:
            continue
        experiment = counted[0].spec.experiment
        tokens = experiment.train.max_steps * experiment.train.batch_size * experiment.data.seq_len
        regimes.append((sweep, tokens / counted[1]))
    return regimes


def _count(verdicts: Sequence[str], label: str) -> int:
    return sum(v == label or v.startswith((f"{label} ", f"{label}:")) for v in verdicts)


def _claims_list(table: pd.DataFrame, label: str, with_q: bool = True) -> str:
    """The rows with a verdict, as "claim (sweep, q Q, how)", q as the table prints it (never rounded again)."""
    items = []
    for _, row in table.iterrows():
        if row["verdict"] == label or row["verdict"].startswith(f"{label} ("):
            how = row["verdict"][len(label):].strip(" ()")
            beside = re.search(r'read beside "([^"]*)": ([^;]*)', str(row.get("note", "")))
            how += (", " if how else "") + f"beside \"{beside.group(1)}\": {beside.group(2)}" if beside else ""
            items.append(f"{row['claim']} ({row['sweep']}, q {row['q']}{', ' + how if how else ''})" if with_q
                         else row["claim"])
    return "; ".join(items) or "none"


def _section_sentence(table: pd.DataFrame, section: str) -> str:
    """One section's rows counted apart, with its correction, and the rows that hold or do not."""
    rows = table[table["section"] == section]
    if rows.empty:
        return ""
    heading, method = SECTIONS[section]
    verdicts = list(rows["verdict"])
    count = {label: _count(verdicts, label) for label in (HOLDS, FAILS, CONFOUNDED, INCONCLUSIVE, NOT_TESTABLE,
                                                          TRUE_BY_CONSTRUCTION, DESCRIPTIVE, NOT_RUN, NOT_ADDRESSED)}
    ways = [sum(v == inconclusive(sign, 1.0) for v in verdicts) for sign in (1.0, -1.0)]
    tested = int((rows["p"] != "").sum())
    shown = [f"{label} {count[label]}" for label in (NOT_TESTABLE, TRUE_BY_CONSTRUCTION, DESCRIPTIVE, NOT_RUN,
                                                      NOT_ADDRESSED) if count[label]]
    counted = f"{len(rows)} row{'s' * (len(rows) != 1)}, {tested} tested ({CORRECTION_NAMES[method]} over them)"
    return (f"{heading[0].upper()}{heading[1:]}: {counted}. Verdicts: {HOLDS} {count[HOLDS]}; {FAILS} "
            f"{count[FAILS]}; {CONFOUNDED} {count[CONFOUNDED]}; {INCONCLUSIVE} {count[INCONCLUSIVE]} ({ways[0]} "
            f"pointing the claim's way, {ways[1]} the other way, {count[INCONCLUSIVE] - sum(ways)} with no direction "
            "to point)" + (f"; counting neither way: {'; '.join(shown)}" if shown else "") + ". "
            f"Holding: {_claims_list(rows, HOLDS)}. Not holding: {_claims_list(rows, FAILS)}.")


def summary(table: pd.DataFrame, regimes: Sequence[tuple[str, float]] = (),
            setups: Mapping[str, str] | None = None) -> str:
    """The first paragraph of results/tiny/README.md, made from the claims table (`claims_table`), the regimes'
    tokens per parameter (`tokens_per_parameter`) and what else sets each regime apart (`setups`: batch, precision,
    device), so that its counts and q-values cannot drift from the table and it says no more than the rules allow."""
    setups = setups or {}
    if "section" not in table:
        table = table.assign(section="exploratory")
    low, high = (t / PAPER_DENSE_PARAMETERS for t in PAPER_DENSE_TOKENS)
    regime_cells = {} if "regime" not in table else \
        {sweep: cell for sweep, cell in zip(table["sweep"], table["regime"], strict=True) if cell not in ("", "n/a")}
    ratios = {sweep: regime_cells.get(sweep, "") for sweep, _ in regimes}

    def described(sweep: str, value: float) -> str:
        ratio = f", G1 at {ratios[sweep]} the paper's effect" if ratios.get(sweep) else ""
        return f"{sweep} {value:,.3g} ({setups[sweep]}{ratio})" if sweep in setups else f"{sweep} {value:,.3g}{ratio}"

    scale = "; ".join(described(sweep, value) for sweep, value in regimes)
    sized = sorted({sweep for sweep, cell in ratios.items() if _commensurate(cell)})
    named = sorted(set(table["sweep"]) - {"-"})
    ran = [sweep for sweep in named if (table[table["sweep"] == sweep]["verdict"] != NOT_RUN).any()]
    unrun = [sweep for sweep in named if sweep not in ran]
    lines = [
        f"The claims table tests the paper's claims on runs of {len(ran)} sweeps at tiny scale"
        + (f" (training tokens a parameter, then what else sets the regime apart: {scale}; the paper's dense models "
           f"see {low:,.0f} to {high:,.0f})" if regimes else "") + f", {len(table)} rows in three sections, each "
        "corrected on its own" + (f"; the rows of {', '.join(unrun)} wait for its runs" if unrun else "") + ".",
        *(sentence for section in SECTIONS if (sentence := _section_sentence(table, section))),
        f"Not addressed (claims of the paper no sweep here tests): {_claims_list(table, NOT_ADDRESSED, with_q=False)}.",
        "Directions are read in every sweep; sizes (closeness, the paper's size excluded) only where G1's effect is "
        f"within {COMMENSURATE:g}x of the paper's"
        + (f" ({', '.join(sized)}); elsewhere such rows are not testable at this scale" if sized else
           ": in no sweep here, so every such row is not testable at this scale")
        + ". A row whose groups start at different attention-output scales is init-scale confounded whichever way it "
        "points, unless a scale-matched control holds; a row whose condition (a sink, a massive activation, an "
        "instability) did not arise is not testable.",
    ]
    if regimes:
        most, value = max(regimes, key=lambda regime: regime[1])
        lines.append(f"The most trained regime here, {most} at {value:,.3g} tokens a parameter, is {low / value:,.2g} "
                     "times short of the paper's least-trained dense model.")
    return " ".join(lines) + "\n"


def _commensurate(cell: str | None) -> bool:
    """Whether a table's regime cell ("1.3x") is inside the regime rule's bounds (`Regime.commensurate`)."""
    try:
        ratio = float(str(cell).rstrip("x"))
    except ValueError:
        return False
    return Regime(ratio, "").commensurate


def run_setups(records_by_sweep: Mapping[str, Sequence[RunRecord]],
               logged_setup: Callable[[str], str | None]) -> dict[str, str]:
    """{sweep: "batch B x T, PRECISION on DEVICE"} from a baseline run of each sweep (`logged_setup(run_id)`: its
    logged precision and device, or None)."""
    setups = {}
    for sweep, records in records_by_sweep.items():
        runs = [r for r in records if r.run_id and r.spec.experiment.variant == "baseline"] or \
            [r for r in records if r.run_id]
        if not runs:
            continue
        train, data = runs[0].spec.experiment.train, runs[0].spec.experiment.data
        logged = logged_setup(runs[0].run_id)
        setups[sweep] = f"batch {train.batch_size} x {data.seq_len}" + (f", {logged}" if logged else "")
    return setups


SUMMARY_START = ("<!-- summary: made by `gatelab claims` from the claims table (summary.md); edits here are "
                 "overwritten -->")
SUMMARY_END = "<!-- end of summary -->"


def replace_summary(readme: Path, paragraph: str) -> bool:
    """Put `paragraph` between the README's summary markers (SUMMARY_START, SUMMARY_END); False, the README left as
    it is, where it has none. The rest of the README is hand-written: it is replaced whole (a staged copy renamed over
    it), so a command killed half-way leaves the old README or the new one, never half of it."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(SUMMARY_START), text.find(SUMMARY_END)
    if start < 0 or end < start:
        return False
    staged = readme.with_name(f".{readme.name}.{os.getpid()}.tmp")
    staged.write_text(f"{text[:start]}{SUMMARY_START}\n{paragraph.strip()}\n{text[end:]}", encoding="utf-8")
    os.replace(staged, readme)
    return True


def write_claims(records: Mapping[str, Sequence[RunRecord]], claims: Sequence[Claim], out_dir: Path,
                 formats: Sequence[str], command: str | None = None, log=print, *,
                 logged_parameters: Callable[[str], int | None],
                 logged_setup: Callable[[str], str | None] = lambda run_id: None) -> list[Path]:
    """The claims table of the runs (`records`, by sweep name), written as `claims.<format>` under `out_dir`, and
    with Markdown its summary paragraph as `summary.md` (`summary`, with `tokens_per_parameter`); prints each claim's
    verdict."""
    from gatelab.report.export import ReportTable, export_report
    from gatelab.report.tables import data_stamp

    frame = claims_table(records, claims)
    missing = dict.fromkeys(note for c in claims for note in missing_note(c.paper.table))  # one note per file
    rules = VERDICT_RULES + ([MULTIPLIER_RULE] if any(c.kind == "multiplier" for c in claims) else [])
    table = ReportTable("The paper's claims at tiny scale", frame, rules + list(missing))
    written = export_report([table], [], out_dir, formats, "claims", command=command,
                            stamp=data_stamp([r for rs in records.values() for r in rs]))
    if "md" in formats:  # the README's first paragraph, from the same table
        paragraph = summary(frame, tokens_per_parameter(records, logged_parameters),
                            run_setups(records, logged_setup))
        written.append(Path(out_dir) / "summary.md")
        written[-1].write_text(paragraph, encoding="utf-8")
        readme = Path(out_dir) / "README.md"
        if readme.exists() and replace_summary(readme, paragraph):
            written.append(readme)
    log(frame[["claim", "ours", "p", "q", "verdict"]].to_string(index=False))
    return written
