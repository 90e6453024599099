"""The paper's published numbers (Qiu et al. 2025, arXiv 2505.06708), shipped with the package, and the one registry of
its tables: which CSV holds each table, and which of its columns are the perplexity, the added parameters and Table 4's
probe measurements. `gatelab sweep plan`, `gatelab table`, `gatelab claims` and the variant registry all read it.

The CSVs are package data (gatelab/paper_tables/), read with importlib.resources, so an installed gatelab prints the
paper's columns as a checkout does; results/paper/ keeps identical copies beside their citation. `$GATELAB_PAPER_DIR`
points gatelab at another folder of the same files.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from gatelab.errors import GatelabError
from gatelab.metrics import F_ATTN, GATE_SCORE_MEAN, M_ACT

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    import pandas as pd

PAPER_DIR_ENV = "GATELAB_PAPER_DIR"


@dataclass(frozen=True)
class PaperTable:
    """One of the paper's tables as gatelab reads it: its CSV (one row per variant id) and its named columns."""

    file: str
    name: str  # as the paper numbers it: "Table 2"
    model: str | None  # the kind of model its rows train: "dense" or "moe" (experiment.model.ffn); None: no models
    setting: str  # the model and budget of the rows a report compares against, for titles and notes
    ppl: str | None = None  # the perplexity column, compared with our ppl/avg
    added: str | None = None  # the added-parameter column, in millions ('-' where the paper gives none)
    probes: tuple[str, ...] = ()  # columns measured here by the probes of the same name (PROBE_METRICS)
    benchmarks: tuple[str, ...] = ()  # benchmark score columns (BENCHMARK_TASKS), shown beside lm-eval's scores
    # (variant id, the table's id) for a table whose ids are not variant ids: the rows that stand for each variant in
    # a report's comparison. Empty where the table's ids are variant ids.
    variant_rows: tuple[tuple[str, str], ...] = ()


_MOE = "MoE 15A2B, 400B tokens"  # Tables 1, 3, 4 and 6 share their baseline, row (1) of each (Avg PPL 6.026)
TABLES: dict[str, PaperTable] = {
    "table1": PaperTable("paper_table1_moe.csv", "Table 1", "moe", _MOE, ppl="Avg PPL", added="Added (M)",
                         benchmarks=("Hellaswag", "MMLU", "GSM8k", "C-eval")),
    # Table 2 has several blocks (depth, tokens, learning rate); its 48-layer, 400B-token, max LR 4e-3 block, rows (5),
    # (8) and (9), is the one with baseline and both G1 gates at the same settings.
    "table2": PaperTable("paper_table2_dense.csv", "Table 2", "dense",
                         "dense 1.7B, 48 layers, 400B tokens, max LR 4e-3", ppl="Avg PPL",
                         benchmarks=("HumanEval", "MMLU", "GSM8k", "Hellaswag", "C-eval", "CMMLU"),
                         variant_rows=(("baseline", "dense48_400b_baseline_lr4e-3"),
                                       ("g1_elem_sig", "dense48_400b_g1_elem_sig_lr4e-3"),
                                       ("g1_head_sig", "dense48_400b_g1_head_sig_lr4e-3"))),
    "table3": PaperTable("paper_table3_nonlinearity.csv", "Table 3", "moe", _MOE, ppl="Avg PPL"),
    "table4": PaperTable("paper_table4_sparsity_sink.csv", "Table 4", "moe", _MOE, ppl="PPL",
                         probes=("Gate Score", "M-Act", "F-Attn")),
    # RULER scores by context length, rows by method, not variant
    "table5": PaperTable("paper_table5_ruler.csv", "Table 5", None, "RULER long-context scores"),
    "table6": PaperTable("paper_table6_switchhead.csv", "Table 6", "moe", _MOE, ppl="PPL", added="Added Param (M)"),
}
CATALOGUE = "variant_catalogue.csv"  # every variant id with its formula and per-layer parameter cost
# The paper's dense G1 effect: G1 against the baseline in each of Table 2's blocks at one learning rate (-0.8% to
# -3.6%), the regime reference of a dense sweep where no claims file names one (the ladder table). The claims file
# spells the same pairs (`table2_g1_gain` in sweeps/claims/tiny.yaml; tests/report/test_claims_ladder.py keeps them so).
DENSE_G1_TABLE, DENSE_G1_VARIANT = "table2", "g1_elem_sig"
DENSE_G1_PAIRS = (("dense28_400b_g1_elem_sig", "dense28_400b_baseline"),
                  ("dense28_3p5t_g1_elem_sig", "dense28_3p5t_baseline"),
                  ("dense48_400b_g1_elem_sig_lr4e-3", "dense48_400b_baseline_lr4e-3"),
                  ("dense48_1t_g1_elem_sig_lr5.3e-3", "dense48_1t_baseline_lr5.3e-3"))

# A sweep's `paper:` key: the tables its report compares against; where one variant id is in several, the last one's
# values win and the earlier ones fill its gaps.
SWEEP_TABLES: dict[str, tuple[str, ...]] = {
    "table1": ("table1",),
    "table2": ("table2",),
    "table3": ("table3",),
    "table4": ("table4",),
    "table6": ("table6",),
    "table3-4": ("table3", "table4"),
    "table1-3-4": ("table1", "table3", "table4"),
}
# The paper's benchmark columns, and the lm-eval task that scores the same benchmark (`gatelab eval --tasks ...`; the
# paper's few-shot settings are its own, so compare directions, not values).
BENCHMARK_TASKS = {"Hellaswag": "hellaswag", "MMLU": "mmlu", "GSM8k": "gsm8k", "C-eval": "ceval-valid",
                   "CMMLU": "cmmlu", "HumanEval": "humaneval"}
# Table 4's mechanistic columns, and the probe metrics of ours that measure the same thing.
PROBE_METRICS = {"Gate Score": GATE_SCORE_MEAN, "M-Act": M_ACT, "F-Attn": F_ATTN}


def paper_dir() -> Traversable:
    """The folder of the paper's CSVs: the package's own, or $GATELAB_PAPER_DIR."""
    if os.environ.get(PAPER_DIR_ENV):
        return Path(os.environ[PAPER_DIR_ENV])
    return files("gatelab") / "paper_tables"


def paper_file(name: str) -> Traversable:
    return paper_dir() / name


def missing_files(paper: str | None) -> list[str]:
    """The CSVs of a sweep's `paper:` key that cannot be found (as paths, for a note)."""
    return [str(paper_file(TABLES[t].file)) for t in SWEEP_TABLES.get(paper or "", ()) if
            not paper_file(TABLES[t].file).is_file()]


def missing_note(paper: str | None) -> list[str]:
    """A note for each missing CSV of `paper`, so that a table without the paper's columns says why."""
    return [f"The paper's {paper} numbers are not shown: {path} is missing." for path in missing_files(paper)]


def _text(table: str) -> tuple[str, str] | None:
    """(path, text) of one table's CSV (a TABLES key); None where it is missing, an error naming it where it is not
    text."""
    path = paper_file(TABLES[table].file)
    if not path.is_file():
        return None
    try:
        return str(path), path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise _damaged(str(path), f"not readable as UTF-8 text ({error})") from None


def _damaged(path: str, why: str) -> GatelabError:
    fix = f"unset ${PAPER_DIR_ENV}" if os.environ.get(PAPER_DIR_ENV) else "reinstall gatelab"
    return GatelabError(f"the paper's table {path}: {why}; restore the file ({fix}: the package ships the paper's "
                        "CSVs)")


def read_rows(table: str) -> list[dict[str, str]] | None:
    """The rows of one table (a TABLES key) as strings; None where its CSV is missing."""
    found = _text(table)
    return None if found is None else list(csv.DictReader(io.StringIO(found[1], newline="")))


def read_frame(table: str) -> pd.DataFrame | None:
    """One table (a TABLES key) as pandas reads its CSV, with its `id` and perplexity columns checked; None where the
    CSV is missing."""
    import pandas as pd

    found = _text(table)
    if found is None:
        return None
    path, text = found
    try:
        frame = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise _damaged(path, f"not a readable CSV ({str(error).strip().splitlines()[0]})") from None
    missing = [c for c in ("id", TABLES[table].ppl) if c is not None and c not in frame.columns]
    if missing:
        raise _damaged(path, f"no column {', '.join(map(repr, missing))} (its columns: {', '.join(frame.columns)})")
    return frame


def added_params(table: str | None) -> dict[str, float | None] | None:
    """{variant id: the paper's added parameters in millions} of a table with that column (table1, table6); None
    where there is no such column or its CSV is missing."""
    if table not in TABLES or TABLES[table].added is None:
        return None
    column, rows = TABLES[table].added, read_rows(table)
    if not rows or column not in rows[0] or "id" not in rows[0]:
        return None
    added: dict[str, float | None] = {}
    for row in rows:
        try:
            added[row["id"]] = float(row[column])
        except (TypeError, ValueError):  # '-' for the baseline of Table 6
            added[row["id"]] = None
    return added


def reference(paper: str | None, by_variant: bool = False) -> pd.DataFrame:
    """The paper's rows for a sweep's `paper:` key, indexed by the tables' ids: `ppl`, Table 4's probe columns and the
    benchmark columns, as numbers (a '-' is NaN). Tables whose CSV is missing are left out (`missing_note` says so).
    `by_variant`: indexed by variant id instead, a table with `variant_rows` giving only those rows, renamed."""
    import pandas as pd

    frames = []
    for name in SWEEP_TABLES.get(paper or "", ()):
        table, frame = TABLES[name], read_frame(name)
        if frame is None:
            continue
        frame = frame.set_index("id")
        if by_variant and table.variant_rows:
            ids = {paper_id: variant for variant, paper_id in table.variant_rows}
            frame = frame.loc[[i for i in frame.index if i in ids]].rename(index=ids)
        keep = {table.ppl: "ppl", **{c: c for c in (*table.probes, *table.benchmarks) if c in frame.columns}}
        frames.append(frame[list(keep)].rename(columns=keep).apply(pd.to_numeric, errors="coerce"))
    if not frames:
        return pd.DataFrame(columns=["ppl"])
    merged = frames[0]
    for frame in frames[1:]:  # a later table's value wins; its gaps (columns it lacks, '-') keep an earlier one's
        merged = frame.combine_first(merged)
    return merged[list(dict.fromkeys(c for f in frames for c in f.columns))]


def title(paper: str | None) -> str:
    """A sweep's `paper:` key in words: "Table 2 (dense 1.7B, 48 layers, 400B tokens, max LR 4e-3)", or "Tables 1, 3
    and 4 (MoE 15A2B, 400B tokens)"."""
    tables = [TABLES[t] for t in SWEEP_TABLES.get(paper or "", ())]
    if not tables:
        return ""
    numbers = [t.name.split()[-1] for t in tables]
    named = tables[0].name if len(tables) == 1 else f"Tables {', '.join(numbers[:-1])} and {numbers[-1]}"
    return f"{named} ({'; '.join(dict.fromkeys(t.setting for t in tables))})"


def model_kinds(paper: str | None) -> set[str]:
    """The kinds of model ("dense", "moe") the tables of a sweep's `paper:` key train."""
    return {TABLES[t].model for t in SWEEP_TABLES.get(paper or "", ()) if TABLES[t].model}


def rows_standing_for_variants(paper: str | None) -> list[str]:
    """For each table of `paper` whose ids are not variant ids, which of its rows stand for which variant, in words
    ("Table 2 rows (5), (8), (9) as baseline, g1_elem_sig, g1_head_sig"); rows are the CSV's `row` labels."""
    lines = []
    for name in SWEEP_TABLES.get(paper or "", ()):
        table = TABLES[name]
        if not table.variant_rows:
            continue
        labels = {row["id"]: row.get("row") or row["id"] for row in read_rows(name) or []}
        lines.append(f"{table.name} rows {', '.join(labels.get(i, i) for _, i in table.variant_rows)} as "
                     f"{', '.join(v for v, _ in table.variant_rows)}")
    return lines
