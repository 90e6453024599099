"""load_data and `gatelab data prepare` (gatelab.data.prepare): a run trains on every domain it names or stops with one
error; a read-only cache that is prepared is usable, and one that needs writing is one error; so is a full disk, and
it leaves no half file that a later prepare would take for a finished one.

The read-only and full-disk cases are real: a read-only bind mount and a small tmpfs in a user and mount namespace of
their own (`unshare`), and an unprivileged user (`setpriv`) for a folder that is not writable by whoever runs. The
tests run as root, which ignores permission bits, so chmod alone would test nothing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gatelab.data import corpora
from gatelab.data.corpora import CorpusManifest
from gatelab.data.identity import spec_hash
from gatelab.data.prepare import load_data
from gatelab.data.resolve import experiment_from_dict
from gatelab.data.sources import Fetched, Source
from gatelab.errors import GatelabError
from tests.data.test_corpora import synthetic_docs
from tests.helpers import MICRO

QUIET = {"log": lambda *_: None, "warn": lambda *_: None}


def micro_data(data_dir: Path, notes: list[Path], domains: list[str]) -> dict:
    return {"domains": domains, "data_dir": str(data_dir), "seq_len": 16,
            "user_files": {"notes": [str(p) for p in notes]} if notes else {}}


def micro(data_dir: Path, domains: list[str], notes: list[Path] = ()):
    return experiment_from_dict({**MICRO, "data": micro_data(data_dir, list(notes), domains)}, "test")


def write_notes(folder: Path, n: int = 8) -> list[Path]:
    """n text files, a user domain: corpus, tokenizer and tokens are made from them in about a second."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, doc in enumerate(synthetic_docs("n", n, 4, length=1500)):
        paths.append(folder / f"note{i}.txt")
        paths[-1].write_text(doc.text, encoding="utf-8")
    return paths


# --- a run trains on every domain it names --------------------------------------------------------------------------


def prose_and_verse(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> None:
    """Two built-in sources in place of the real ones: alpha feeds 'prose', beta 'verse'; those named in `failing`
    fail as a junk package in sources/ makes them fail."""

    def fetch(name: str, domain: str, seed: int):
        def fetched(data_dir: Path) -> Fetched:
            if name in failing:
                raise corpora.DataError(f"{data_dir}/sources/{name}.deb: not a Debian package (simulated)")
            return Fetched("1.0", (), {domain: synthetic_docs(name, 30, seed, length=1500)})

        return fetched

    monkeypatch.setattr(corpora, "SOURCES", {
        "alpha": Source("alpha", ("prose",), fetch("alpha", "prose", 1), "get-alpha --into {sources}"),
        "beta": Source("beta", ("verse",), fetch("beta", "verse", 2), "get-beta"),
    })


def test_a_damaged_domain_whose_source_fails_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault report's case: a prepared domain's train.jsonl is truncated and its cached source is junk."""
    failing: set[str] = set()
    prose_and_verse(monkeypatch, failing)
    experiment = micro(tmp_path / "data", ["prose", "verse"])
    load_data(experiment, **QUIET)
    train = tmp_path / "data" / "corpora" / "prose" / "train.jsonl"
    train.write_text(train.read_text()[:-200])
    failing.add("alpha")
    warnings: list[str] = []
    with pytest.raises(GatelabError) as caught:
        load_data(experiment, log=lambda *_: None, warn=warnings.append)
    message = str(caught.value)
    assert "\n" not in message and not warnings, (message, warnings)
    assert message.startswith(f"data.domains: prose could not be prepared in {tmp_path / 'data'}: prose needs alpha "
                              f"({train} was damaged since it was built and cannot be rebuilt: "), message
    assert f"{tmp_path / 'data'}/sources/alpha.deb: not a Debian package" in message
    assert f"get-alpha --into {tmp_path / 'data' / 'sources'}" in message
    assert "`gatelab data prepare PRESET`" in message and "--set data.domains=[verse]" in message
    assert "spec hash changes" in message


def test_a_domain_that_was_never_prepared_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prose_and_verse(monkeypatch, {"alpha", "beta"})
    with pytest.raises(GatelabError, match=r"prose, verse could not be prepared .*get-alpha.*get-beta") as caught:
        load_data(micro(tmp_path / "data", ["prose", "verse"]), **QUIET)
    assert "--set data.domains" not in str(caught.value)  # no domain left to train on: nothing to leave out


def test_leaving_a_domain_out_is_another_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prose_and_verse(monkeypatch, {"alpha"})
    both, verse = micro(tmp_path / "data", ["prose", "verse"]), micro(tmp_path / "data", ["verse"])
    assert spec_hash(both) != spec_hash(verse)
    _, _, domains = load_data(verse, **QUIET)
    assert domains == ["verse"]


def test_junk_in_a_cached_debian_package_names_the_file_to_delete(tmp_path: Path) -> None:
    """The real scripture source on packages overwritten with junk: one error naming the .deb, never a warning."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs dpkg-deb, which reads the scripture packages")
    data_dir = tmp_path / "data"
    (data_dir / "sources").mkdir(parents=True)
    for deb in ("bible-kjv_4.38_amd64.deb", "bible-kjv-text_4.38_all.deb"):
        (data_dir / "sources" / deb).write_bytes(os.urandom(4096))
    experiment = micro(data_dir, ["scripture", "notes"], write_notes(tmp_path / "notes"))
    warnings: list[str] = []
    with pytest.raises(GatelabError) as caught:
        load_data(experiment, log=lambda *_: None, warn=warnings.append)
    message = str(caught.value)
    assert not warnings and "\n" not in message, (warnings, message)
    assert message.startswith("data.domains: scripture could not be prepared"), message
    assert f"{data_dir / 'sources' / 'bible-kjv-text_4.38_all.deb'}: dpkg-deb cannot read it" in message
    assert "delete it and prepare again" in message and "--set data.domains=[notes]" in message


# --- a read-only cache, an unwritable one, a full disk: for real, in namespaces of their own ------------------------


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                              timeout=30, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


needs_unshare = pytest.mark.skipif(not _unshare_works(), reason="needs `unshare --user --map-root-user --mount` (user "
                                   "namespaces) to mount a read-only folder or a small tmpfs without root")


def in_namespace(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """`script` (sh) as root of a new user and mount namespace: its mounts vanish with it."""
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def read_only(folder: Path) -> str:
    return f"mount --bind {shlex.quote(str(folder))} {shlex.quote(str(folder))} && " \
           f"mount -o remount,bind,ro {shlex.quote(str(folder))}"


def prepare(preset: Path, *extra: str) -> str:
    return shlex.join([sys.executable, "-m", "gatelab", "data", "prepare", str(preset), *extra])


def write_preset(folder: Path, data_dir: Path, notes: list[Path], domains: list[str] = ("notes",)) -> Path:
    path = folder / "micro.yaml"
    path.write_text(yaml.safe_dump({**MICRO, "data": micro_data(data_dir, notes, list(domains))}))
    return path


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def prepared_notes(tmp_path: Path) -> tuple[Path, Path]:
    """(data dir, preset) of the `notes` domain, its corpus, tokenizer and tokens already prepared."""
    data_dir = tmp_path / "data"
    notes = write_notes(tmp_path / "notes")
    preset = write_preset(tmp_path, data_dir, notes)
    load_data(micro(data_dir, ["notes"], notes), **QUIET)
    return data_dir, preset


@needs_unshare
def test_a_prepared_read_only_cache_is_usable(tmp_path: Path) -> None:
    data_dir, preset = prepared_notes(tmp_path)
    proc = in_namespace(f"{read_only(data_dir)} && {prepare(preset)}", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tokens: notes" in proc.stdout and "tokenizing" not in proc.stdout, proc.stdout


@needs_unshare
def test_a_read_only_cache_that_needs_writing_is_one_error(tmp_path: Path) -> None:
    data_dir, preset = prepared_notes(tmp_path)
    shutil.rmtree(next(data_dir.glob("tokens/*/notes.train")))  # the train split's tokens must be made again
    line = one_error_line(in_namespace(f"{read_only(data_dir)} && {prepare(preset)}", tmp_path))
    assert line.startswith(f"error: data directory {data_dir}: cannot write "), line
    assert "read-only file system" in line and "$GATELAB_DATA_DIR" in line, line


@needs_unshare
def test_prepare_into_a_read_only_folder_is_one_error(tmp_path: Path) -> None:
    """Built-in corpora (no preset) and a preset, into a read-only data directory and one that cannot be created."""
    parent = tmp_path / "ro"
    (parent / "data").mkdir(parents=True)
    preset = write_preset(tmp_path, parent / "data", write_notes(tmp_path / "notes"))
    builtin = shlex.join([sys.executable, "-m", "gatelab", "data", "prepare", "--data-dir", str(parent / "data"),
                          "--domain", "code"])
    for command, data_dir in ((builtin, parent / "data"), (prepare(preset), parent / "data"),
                              (prepare(preset, "--data-dir", str(parent / "new" / "data")), parent / "new" / "data")):
        line = one_error_line(in_namespace(f"{read_only(parent)} && {command}", tmp_path))
        assert line.startswith(f"error: data directory {data_dir}: cannot write "), line
        assert "(read-only file system)" in line and "$GATELAB_DATA_DIR" in line, line
    assert not list(parent.rglob("*.tmp"))


@needs_unshare
@pytest.mark.parametrize("kilobytes", [8, 24, 40])
def test_a_full_disk_is_one_error_and_leaves_no_half_file(tmp_path: Path, kilobytes: int) -> None:
    """Prepare onto a tmpfs too small for the data (on 4 KiB pages these sizes run out in the corpora, the tokenizer
    and the tokens), then, given room, prepare again: the result is that of a prepare that never ran out of space."""
    data_dir, copy = tmp_path / "disk", tmp_path / "after"
    data_dir.mkdir()
    notes = write_notes(tmp_path / "notes")
    preset = write_preset(tmp_path, data_dir, notes)
    disk = shlex.quote(str(data_dir))
    proc = in_namespace(
        f"mount -t tmpfs -o size={kilobytes}k tmpfs {disk} && {{ {prepare(preset)} > out.txt 2> err.txt; "
        f"echo $? > rc.txt; find {disk} -name '*.tmp' > tmp.txt; "
        f"mount -o remount,size=64m {disk} && {prepare(preset)} && cp -a {disk} {shlex.quote(str(copy))}; }}",
        tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    full = subprocess.CompletedProcess([], int((tmp_path / "rc.txt").read_text()), (tmp_path / "out.txt").read_text(),
                                       (tmp_path / "err.txt").read_text())
    line = one_error_line(full)
    assert line.startswith(f"error: data directory {data_dir}: cannot write {data_dir}/"), line
    assert "(no space left on the device)" in line and f"df -h {data_dir}" in line, line
    assert (tmp_path / "tmp.txt").read_text() == ""
    reference = tmp_path / "reference"
    load_data(micro(reference, ["notes"], notes), **QUIET)
    assert CorpusManifest.load(copy).domains == CorpusManifest.load(reference).domains
    assert contents(copy / "tokens") == contents(reference / "tokens")
    assert contents(copy / "tokenizers") == contents(reference / "tokenizers")


def contents(folder: Path) -> dict[str, bytes]:
    """Every file's bytes by relative path, less the stamps (which hold mtimes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != "stamps.json"}


# --- a cache folder this user cannot write: an unprivileged user, as a shared cache is used -------------------------


def _nobody_can_run_python() -> bool:
    try:
        return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                               "import gatelab"], capture_output=True, timeout=60, cwd="/", check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder others can read (pytest's tmp_path is private to root), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="gatelab-shared-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.skipif(os.geteuid() != 0 or not _nobody_can_run_python(),
                    reason="needs root, to run gatelab as the unprivileged user nobody (setpriv)")
def test_a_cache_of_another_user_is_read_without_writing(shared: Path) -> None:
    data_dir = shared / "data"
    notes = write_notes(shared / "notes")
    preset = write_preset(shared, data_dir, notes)
    load_data(micro(data_dir, ["notes"], notes), **QUIET)
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by all, writable by root alone
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {**os.environ, "HOME": str(shared)}
    proc = subprocess.run([*nobody, *shlex.split(prepare(preset))], cwd=shared, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tokens: notes" in proc.stdout

    shutil.rmtree(next(data_dir.glob("tokens/*/notes.train")))
    line = one_error_line(subprocess.run([*nobody, *shlex.split(prepare(preset))], cwd=shared, env=env,
                                         capture_output=True, text=True, timeout=300, check=False))
    assert line.startswith(f"error: data directory {data_dir}: cannot write "), line
    assert "(permission denied)" in line and "$GATELAB_DATA_DIR" in line, line


# --- the data directory's lock, held by a process that does not let go ----------------------------------------------

HOLD_THE_LOCK = ("import fcntl, os, signal, sys; lock = open(sys.argv[1], 'a'); fcntl.flock(lock, fcntl.LOCK_EX); "
                 "print('held', flush=True); os.kill(os.getpid(), signal.SIGSTOP); signal.pause()")


def test_a_wait_for_the_data_lock_says_what_it_waits_for_and_repeats(tmp_path: Path, monkeypatch) -> None:
    """A process stopped (SIGSTOP) while it holds the lock kept another waiting in silence (92 s in the report)."""
    import signal
    import threading

    from gatelab.data import prepare

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    lock = data_dir / ".prepare.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(prepare, "LOCK_QUIET_S", 0.3)
        monkeypatch.setattr(prepare, "LOCK_REPEAT_S", 0.3)
        lines: list[str] = []
        taken = threading.Event()

        def wait_for_the_lock() -> None:
            with prepare._one_process_at_a_time(data_dir, say=lines.append):
                taken.set()

        waiter = threading.Thread(target=wait_for_the_lock, daemon=True)
        waiter.start()
        while len(lines) < 2:  # said, and said again while the wait lasts
            assert waiter.is_alive() and not taken.is_set()
            taken.wait(0.05)
        for line in lines[:2]:
            assert f"the data directory's lock {lock}, held by PID {holder.pid}, which is stopped" in line, line
            assert f"kill -CONT {holder.pid}" in line, line
        holder.send_signal(signal.SIGKILL)  # its lock goes with it
        waiter.join(60)
        assert taken.is_set()
    finally:
        holder.kill()
        holder.wait()
