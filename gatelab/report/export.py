"""Write a report's tables, notes and plots as Markdown, CSV, LaTeX and one self-contained HTML page.

File names stay short: `<name>.csv` for the first (main) table and `<name>_<key>.csv` for each further one and each
data frame of numbers beside them (`<name>_seeds.csv`: every seed's value), `<name>.tex`, `<name>.html`, and
`<name>.md` or a chosen name such as README.md (GitHub shows it for the folder).
Markdown uses pandas' `DataFrame.to_markdown` (needs `tabulate`); LaTeX uses `DataFrame.to_latex` (Styler-based: needs
`jinja2`). The HTML page inlines its CSS and every plot (base64 PNG), runs no JavaScript and loads nothing from the
network, so it opens from disk anywhere.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from gatelab.errors import GatelabError

FORMATS = ("md", "csv", "latex", "html")
_ALIASES = {"markdown": "md", "tex": "latex", "htm": "html"}


@dataclass
class ReportTable:
    title: str
    frame: pd.DataFrame  # already formatted: string cells
    notes: list[str] = field(default_factory=list)  # lines printed under the table
    key: str = ""  # a short name for files and anchors: a further table's CSV is <name>_<key>.csv
    # Columns the HTML page folds under the others (in a <details>), so that a wide table fits a laptop's screen.
    secondary: Sequence[str] = ()


@dataclass
class ReportSection:
    """Text under the tables: a heading and its paragraphs."""

    title: str
    paragraphs: list[str]


# The first line of a Markdown report: a README.md without it was written by hand and is never overwritten.
GENERATED_MARK = "<!-- Made by gatelab"


def check_markdown_target(path: Path) -> None:
    """Refuse to overwrite a hand-written README.md (one without GENERATED_MARK); raised before anything is written."""
    path = Path(path)
    if path.name != "README.md" or not path.is_file():
        return
    with path.open(encoding="utf-8", errors="replace") as handle:
        first = handle.readline()
    if not first.startswith(GENERATED_MARK):
        raise GatelabError(f"{path}: written by hand (its first line is not {GENERATED_MARK!r}...), so the report does "
                           "not overwrite it; move it away, or name another folder with --out")


def export_report(tables: Sequence[ReportTable], plots: Sequence[Path], out_dir: Path, formats: Sequence[str],
                  name: str, command: str | None = None, stamp: str | None = None, markdown_name: str | None = None,
                  sections: Sequence[ReportSection] = (), data: dict[str, pd.DataFrame] | None = None) -> list[Path]:
    """Write the report in each of `formats` (md, csv, latex, html) under `out_dir`; returns the written paths.
    An unknown format raises ValueError naming the valid ones, before anything is written. `stamp` says what the report
    was made from (default: the time now); a stamp drawn from the data makes a re-made report byte-identical.
    `markdown_name`: the Markdown file's name (default `<name>.md`); `sections`: text after the tables; `data`:
    frames of raw numbers, written with the CSV format only, as `<name>_<key>.csv` (a table's cells are text)."""
    chosen = check_formats(formats)
    out_dir = Path(out_dir)
    markdown_path = out_dir / (markdown_name or f"{name}.md")
    if "md" in chosen:
        check_markdown_target(markdown_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [Path(p) for p in plots]
    stamp = stamp or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    written: list[Path] = []
    for fmt in chosen:
        if fmt == "md":
            written.append(_write(markdown_path, _markdown(tables, plots, out_dir, name, command, stamp, sections)))
        elif fmt == "csv":
            written.extend(_csv(tables, out_dir, name))
            for key, frame in (data or {}).items():
                frame.to_csv(out_dir / f"{name}_{key}.csv", index=False)
                written.append(out_dir / f"{name}_{key}.csv")
        elif fmt == "latex":
            written.append(_write(out_dir / f"{name}.tex", _latex(tables, plots, out_dir, name, command, stamp,
                                                                  sections)))
        else:
            written.append(_write(out_dir / f"{name}.html", _html(tables, plots, name, command, stamp, sections)))
    return written


def check_formats(formats: Sequence[str]) -> list[str]:
    if isinstance(formats, str):
        formats = formats.split(",")
    chosen: list[str] = []
    unknown = []
    for raw in formats:
        fmt = _ALIASES.get(raw.strip().lower(), raw.strip().lower())
        if fmt not in FORMATS:
            unknown.append(raw)
        elif fmt not in chosen:
            chosen.append(fmt)
    if unknown or not chosen:
        what = ("unknown report format " + ", ".join(repr(u) for u in unknown)) if unknown else "no report format given"
        raise ValueError(f"{what}; valid formats: {', '.join(FORMATS)}")
    return chosen


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _flat(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as strings with flat string column names; an index that carries information becomes a column."""
    frame = frame.copy()
    if isinstance(frame.columns, pd.MultiIndex):
        frame.columns = [" ".join(str(p) for p in parts if str(p)) for parts in frame.columns]
    else:
        frame.columns = [str(c) for c in frame.columns]
    keep_index = not (isinstance(frame.index, pd.RangeIndex) and frame.index.name is None)
    if keep_index:
        frame = frame.reset_index()
        frame.columns = [str(c) for c in frame.columns]
    return frame.fillna("").astype(str)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60].strip("_")


def _table_slug(table: ReportTable, number: int) -> str:
    return _slug(table.key or table.title) or f"table{number}"


def _plot_caption(path: Path) -> str:
    return path.stem.replace("_", " ").replace("-", " ")


# -- Markdown ------------------------------------------------------------------------------------------------------

def _md_cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _markdown(tables, plots, out_dir: Path, name: str, command: str | None, stamp: str, sections=()) -> str:
    made = "made again by the command below" if command else "made again by the same command"
    lines = [f"{GENERATED_MARK} from MLflow runs and {made}: edits here are overwritten. -->",
             f"# {name}", "", f"Generated {stamp}" + (f" by `{command}`" if command else "") + ".", ""]
    for table in tables:
        frame = _flat(table.frame)
        frame = frame.map(_md_cell)
        frame.columns = [_md_cell(c) for c in frame.columns]
        lines += [f"## {table.title}", "", frame.to_markdown(index=False, disable_numparse=True), ""]
        lines += [f"- {note}" for note in table.notes]
        lines += [""] if table.notes else []
    for section in sections:
        lines += [f"## {section.title}", ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
    if plots:
        lines += ["## Plots", ""]
        for plot in plots:
            link = Path(os.path.relpath(plot.resolve(), out_dir.resolve())).as_posix()
            lines += [f"![{_plot_caption(plot)}]({link})", ""]
    return "\n".join(lines).rstrip() + "\n"


# -- CSV -----------------------------------------------------------------------------------------------------------

def _csv(tables, out_dir: Path, name: str) -> list[Path]:
    """The first table as <name>.csv, each further one as <name>_<its key>.csv."""
    written, used = [], set()
    for number, table in enumerate(tables, 1):
        slug = "" if number == 1 else _table_slug(table, number)
        base, suffix = slug or "main", 2
        while slug in used:
            slug, suffix = f"{base}_{suffix}", suffix + 1
        used.add(slug)
        frame = _flat(table.frame)
        path = out_dir / (f"{name}_{slug}.csv" if slug else f"{name}.csv")
        frame.to_csv(path, index=False)
        written.append(path)
    return written


# -- LaTeX ---------------------------------------------------------------------------------------------------------

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_UNICODE = {"±": r"$\pm$", "Δ": r"$\Delta$", "δ": r"$\delta$", "τ": r"$\tau$", "ρ": r"$\rho$",
                  "σ": r"$\sigma$", "μ": r"$\mu$", "α": r"$\alpha$", "β": r"$\beta$", "×": r"$\times$",
                  "≤": r"$\leq$", "≥": r"$\geq$", "≈": r"$\approx$", "−": "-", "–": "--", "—": "---",
                  "→": r"$\rightarrow$", "<": r"\textless{}", ">": r"\textgreater{}", "†": r"\dag{}",
                  "‡": r"\ddag{}", "…": r"\dots{}", "é": r"\'e", "’": "'"}


def _latex_escape(text: str) -> str:
    """Escape LaTeX's special characters and spell the Unicode symbols the tables use (±, Δ, τ...) so pdflatex
    compiles the file without a Unicode font."""
    return "".join(_LATEX_SPECIAL.get(ch) or _LATEX_UNICODE.get(ch) or ch for ch in str(text))


def _latex(tables, plots, out_dir: Path, name: str, command: str | None, stamp: str, sections=()) -> str:
    body = []
    for number, table in enumerate(tables, 1):
        frame = _flat(table.frame)
        frame = frame.map(_latex_escape)
        frame.columns = [_latex_escape(c) for c in frame.columns]
        tabular = frame.to_latex(index=False, escape=False, column_format="l" * frame.shape[1])
        body += [r"\begin{table}[htbp]", r"\centering", rf"\caption{{{_latex_escape(table.title)}}}",
                 rf"\label{{tab:{_table_slug(table, number)}}}",
                 r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",  # shrinks wide tables only
                 tabular.rstrip(), "}"]
        if table.notes:
            body += [r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize"]
            body += [_latex_escape(note) + r"\par" for note in table.notes]
            body += [r"\end{minipage}"]
        body += [r"\end{table}", ""]
    for section in sections:
        body += [rf"\section*{{{_latex_escape(section.title)}}}"]
        body += [_latex_escape(paragraph) + "\n" for paragraph in section.paragraphs]
    for plot in plots:
        link = Path(os.path.relpath(plot.resolve(), out_dir.resolve())).as_posix()
        body += [r"\begin{figure}[htbp]", r"\centering", rf"\includegraphics[width=\linewidth]{{{link}}}",
                 rf"\caption{{{_latex_escape(_plot_caption(plot))}}}", r"\end{figure}", ""]
    made = f"% Generated {stamp}" + (f" by: {command}" if command else "")
    return "\n".join([
        f"% gatelab report: {name}", made.replace("\n", " "),
        r"\documentclass{article}", r"\usepackage[utf8]{inputenc}", r"\usepackage[T1]{fontenc}",
        r"\usepackage{booktabs}", r"\usepackage{graphicx}", r"\usepackage[margin=2cm]{geometry}",
        rf"\title{{{_latex_escape(name)}}}", r"\author{gatelab}", r"\date{" + _latex_escape(stamp) + "}",
        r"\begin{document}", r"\maketitle", "", *body, r"\end{document}", ""])


# -- HTML ----------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; color: #1d1d1f; background: #fff; line-height: 1.45; }
h1 { font-size: 1.7rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
.meta { color: #555; font-size: 0.9rem; }
.meta code { background: #f3f3f3; padding: 0.1rem 0.3rem; border-radius: 3px; }
.table-wrap { overflow-x: auto; }
table.report { border-collapse: collapse; font-size: 0.85rem; font-variant-numeric: tabular-nums; }
/* Text wraps at spaces and after / and _ (<wbr>): a table as wide as the page shrinks to it instead of scrolling. */
table.report th, table.report td { border: 1px solid #d0d0d0; padding: 0.3rem 0.45rem; }
table.report th { background: #eef2f7; text-align: left; vertical-align: bottom; overflow-wrap: break-word; }
details.more-columns { margin: 0.6rem 0; }
details.more-columns summary { cursor: pointer; color: #333; font-size: 0.85rem; }
details.more-columns table.report { font-size: 0.8rem; margin-top: 0.5rem; }
table.report.wide { font-size: 0.75rem; }  /* more than HTML_COLUMNS columns, all of them main ones */
table.report.wide th, table.report.wide td { padding: 0.25rem 0.3rem; }
table.report tbody tr:nth-child(even) { background: #fafafa; }
table.report td { text-align: right; }
table.report td:first-child { text-align: left; font-weight: 600; }
ul.notes { font-size: 0.85rem; color: #333; }
figure { margin: 1.5rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.85rem; }
.missing { color: #a00; }
"""


def _breakable(text: str) -> str:
    """Text as HTML, free to break after '/' and '_' as well as at spaces: metric names and variant ids
    (probe/m_act_share_layers_max_at_first_token) would otherwise set a column's narrowest width."""
    return re.sub(r"([/_])", r"\1<wbr>", html.escape(str(text)))


def _html_table(frame: pd.DataFrame, table_id: str) -> str:
    head = "".join(f"<th scope=\"col\">{_breakable(c)}</th>" for c in frame.columns)
    rows = []
    for values in frame.itertuples(index=False, name=None):
        rows.append("<tr>" + "".join(f"<td>{_breakable(v)}</td>" for v in values) + "</tr>")
    wide = " wide" if len(frame.columns) > HTML_COLUMNS else ""
    return (f'<table class="report{wide}" id="{table_id}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
            + "\n".join(rows) + "\n</tbody>\n</table>")


# The most columns of one HTML table: a comparison's twelve fit a 1400-pixel screen; secondary ones go in more tables.
HTML_COLUMNS = 12


def _html_tables(frame: pd.DataFrame, secondary: Sequence[str], table_id: str) -> str:
    """The table's main columns, then its secondary ones folded in a <details>, in tables of at most HTML_COLUMNS
    columns that each repeat the first (row) column."""
    folded = [c for c in frame.columns[1:] if c in set(secondary)]
    parts = [f'<div class="table-wrap">{_html_table(frame[[c for c in frame.columns if c not in folded]], table_id)}'
             "</div>"]
    if folded:
        tables = math.ceil(len(folded) / (HTML_COLUMNS - 1))
        per_table = math.ceil(len(folded) / tables)  # as even as can be: 12 columns are two tables of 6, not 11 and 1
        parts.append(f'<details class="more-columns"><summary>{len(folded)} more columns: '
                     f"{html.escape(', '.join(folded))}</summary>")
        for number, start in enumerate(range(0, len(folded), per_table), 1):
            chunk = frame[[frame.columns[0], *folded[start:start + per_table]]]
            parts.append(f'<div class="table-wrap">{_html_table(chunk, f"{table_id}-more-{number}")}</div>')
        parts.append("</details>")
    return "\n".join(parts)


def _html(tables, plots, name: str, command: str | None, stamp: str, sections=()) -> str:
    esc = html.escape
    parts = [f"<h1>{esc(name)}</h1>",
             f'<p class="meta">Generated <time>{esc(stamp)}</time>'
             + (f" by <code>{esc(command)}</code>" if command else "") + ".</p>"]
    used = set()
    for number, table in enumerate(tables, 1):
        table_id = f"table-{_table_slug(table, number)}"
        if table_id in used:
            table_id = f"{table_id}-{number}"
        used.add(table_id)
        frame = _flat(table.frame)
        parts += ['<section class="table-block">', f'<h2>{esc(table.title)}</h2>',
                  _html_tables(frame, table.secondary, table_id)]
        if table.notes:
            parts += ['<ul class="notes">'] + [f"<li>{esc(note)}</li>" for note in table.notes] + ["</ul>"]
        parts.append("</section>")
    for section in sections:
        parts += ['<section class="text">', f"<h2>{esc(section.title)}</h2>",
                  *(f"<p>{esc(paragraph)}</p>" for paragraph in section.paragraphs), "</section>"]
    if plots:
        parts.append('<section class="plots"><h2>Plots</h2>')
        for plot in plots:
            caption = esc(_plot_caption(plot))
            if plot.is_file():
                data = base64.b64encode(plot.read_bytes()).decode("ascii")
                parts.append(f'<figure id="plot-{_slug(plot.stem)}"><img src="data:image/png;base64,{data}" '
                             f'alt="{caption}"><figcaption>{caption}</figcaption></figure>')
            else:
                parts.append(f'<p class="missing">plot missing: {esc(str(plot))}</p>')
        parts.append("</section>")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">', f"<title>{esc(name)}: gatelab report</title>",
        f"<style>{_CSS}</style>", "</head>", "<body>", *parts, "</body>", "</html>", ""])
