"""The docs point at what is there (issue 46): links of committed Markdown, paths README.md and docstrings name, the
README's `gatelab` commands (parsed, not run), its sweep file, its length."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest
import typer

from gatelab.cli import app
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import REPO

try:  # typer 0.2x vendors click as typer._click, and its commands raise that copy's errors
    from typer._click.exceptions import UsageError
except ImportError:
    from click import UsageError

README = REPO / "README.md"
README_MAX_LINES = 250
# Named by the README as files the reader makes (its sweep example), not shipped.
MADE_BY_THE_READER = {"sweeps/my-gates.yaml"}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
CODE_SPAN = re.compile(r"`([^`]+)`")  # a span may wrap onto the next line
PACKAGE_FOLDERS = ("experiments/", "sweeps/", "results/", "gatelab/", "tests/")


def _committed(*patterns: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=REPO, capture_output=True, check=True)
    return [REPO / name for name in listed.stdout.decode().split("\0") if name]


def _without_code(markdown: str) -> str:
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def _relative_links(markdown: str) -> list[str]:
    prose = _without_code(markdown)
    targets = LINK.findall(prose) + REFERENCE_DEFINITION.findall(prose)
    return [target for target in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", target)]


def _missing_link_targets(path: Path) -> list[str]:
    missing = []
    for target in _relative_links(path.read_text(encoding="utf-8")):
        file_part = unquote(target.split("#", 1)[0])
        resolved = (REPO / file_part.lstrip("/")) if file_part.startswith("/") else (path.parent / file_part)
        if not resolved.exists():
            missing.append(target)
    return missing


MARKDOWN_FILES = _committed("*.md")


@pytest.mark.parametrize("path", MARKDOWN_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_of_a_committed_markdown_file_resolves(path):
    assert _missing_link_targets(path) == [], f"{path.relative_to(REPO)}: links to nothing"


def test_a_broken_link_is_found_and_code_and_urls_are_not_links(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.png").write_bytes(b"")
    page.write_text("[a](there.png#x) ![b](gone.png) [c](https://example.org/x) [d](#anchor)\n"
                    "`[e](in-code.md)`\n```bash\n[f](in-fence.md)\n```\n[g]: also-gone.md\n")
    assert _missing_link_targets(page) == ["gone.png", "also-gone.md"]


def _top_level_folders() -> set[str]:
    return {p.relative_to(REPO).parts[0] for p in _committed() if len(p.relative_to(REPO).parts) > 1}


def _looks_like_a_repository_path(token: str, folders: set[str]) -> bool:
    if "://" in token or "/" not in token or any(c in token for c in "<>{}$=~"):
        return False
    return bool(re.search(r"\.\w+$", token)) or token.split("/", 1)[0] in folders


def _exists(token: str) -> bool:
    return any(REPO.glob(token)) if "*" in token else (REPO / token).exists()


def _named_paths(markdown: str) -> set[str]:
    """Path-like words of the inline code spans and of the bash blocks (commands and their comments)."""
    spans = CODE_SPAN.findall(FENCE.sub("", markdown))
    blocks = [body for kind, body in FENCE.findall(markdown) if kind == "bash"]
    words = " ".join(spans + blocks).split()
    folders = _top_level_folders()
    stripped = (word.strip("\"'(),;:`") for word in words)
    return {word for word in stripped if _looks_like_a_repository_path(word, folders)}


def test_every_repository_path_the_readme_names_exists():
    named = _named_paths(README.read_text(encoding="utf-8"))
    assert "experiments/scripts/gpu-check.sh" in named and "results/quickstart/mlflow-ui.png" in named
    missing = sorted(p for p in named - MADE_BY_THE_READER if not _exists(p))
    assert missing == [], f"README.md names paths that do not exist: {missing}"


def test_a_path_is_told_from_a_metric_a_url_and_a_home_folder():
    folders = {"experiments", ".ci"}
    assert _looks_like_a_repository_path("experiments/tiny.yaml", folders)
    assert _looks_like_a_repository_path(".ci/run", folders)
    for word in ("ppl/avg", "postgresql://user:pw@db/mlflow", "~/.cache/gatelab/data", "runs/reports/quickstart/",
                 "g1_elem_sig+g2_elem_sig", "results/bench/<gpu>/"):
        assert not _looks_like_a_repository_path(word, folders), word


def _readme_commands() -> list[str]:
    """Each line of README.md's bash blocks that runs gatelab, its trailing comment cut."""
    blocks = [body for kind, body in FENCE.findall(README.read_text(encoding="utf-8")) if kind == "bash"]
    lines = [line.split("  #", 1)[0].strip() for body in blocks for line in body.splitlines()]
    return [line for line in lines if line.startswith("gatelab ")]


def _parse(command_line: str) -> None:
    """Parse a gatelab command line as click would run it, down to the leaf command, without running it."""
    command = typer.main.get_command(app)
    name, args, parent = "gatelab", shlex.split(command_line)[1:], None
    while True:
        context = command.make_context(name, args, parent=parent)
        if not hasattr(command, "resolve_command"):  # a leaf command: its arguments and options parsed
            return
        rest = [*context._protected_args, *context.args]  # click 8.2+: the subcommand and what follows it
        name, command, args = command.resolve_command(context, rest)
        parent = context


README_COMMANDS = _readme_commands()


@pytest.mark.parametrize("line", README_COMMANDS)
def test_each_gatelab_command_of_the_readme_parses(line):
    _parse(line)


def test_a_command_line_that_does_not_parse_is_caught():
    assert len(README_COMMANDS) >= 10
    for bad in ("gatelab sweep rnu sweeps/quickstart.yaml", "gatelab train experiments/tiny.yaml --varient x",
                "gatelab table"):
        with pytest.raises(UsageError):
            _parse(bad)


def test_the_readme_sweep_file_loads(tmp_path):
    """The sweep file the README shows is valid as written, saved where it says (beside the shipped presets)."""
    body = next(body for kind, body in FENCE.findall(README.read_text(encoding="utf-8")) if kind == "yaml")
    assert len(body.splitlines()) <= 16
    (tmp_path / "experiments").symlink_to(REPO / "experiments", target_is_directory=True)
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "my-gates.yaml").write_text(body)
    assert len(expand(load_sweep(tmp_path / "sweeps" / "my-gates.yaml"))) == 8


def test_the_readme_is_read_in_ten_minutes():
    assert README.read_text(encoding="utf-8").count("\n") <= README_MAX_LINES


def _docstring_paths(source: str) -> set[str]:
    paths = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for span in CODE_SPAN.findall(ast.get_docstring(node, clean=False) or ""):
                paths |= {word.rstrip(".,:;)") for word in span.split() if word.startswith(PACKAGE_FOLDERS)}
    return {p for p in paths if not any(c in p for c in "<>{}")}


def test_every_repository_path_a_docstring_names_in_backticks_exists():
    missing = sorted(f"{path.relative_to(REPO)}: {named}" for path in _committed("gatelab/*.py")
                     for named in _docstring_paths(path.read_text(encoding="utf-8")) if not _exists(named))
    assert missing == []


def test_docstring_paths_are_read_from_backticks_in_docstrings_only():
    source = ('"""Reads `sweeps/x.yaml` and `results/<gpu>/`."""\n'
              '# `tests/comment.py`\ndef f():\n    """`gatelab/y.py`."""\n')
    assert _docstring_paths(source) == {"sweeps/x.yaml", "gatelab/y.py"}
