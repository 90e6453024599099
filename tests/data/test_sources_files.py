"""`data.source: files` and `hf`: the user's parquet and jsonl shards (or a Hub dataset, here a local folder of shards)
streamed into split files, cached, hashed into the run's identity, and each bad input one message."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gatelab.config import DataConfig, ExperimentConfig
from gatelab.data.corpora import HELDOUT_FRACTION, MIN_HELDOUT_DOCS, heldout_score
from gatelab.data.external import corpus_dir, prepare_source
from gatelab.data.identity import spec_hash
from gatelab.data.resolve import experiment_from_dict
from gatelab.errors import GatelabError
from tests.helpers import MICRO

GENRES = ("letters", "poems")
WORDS = ["the", "river", "ran", "past", "the", "mill", "and", "the", "miller", "sang", "of", "wheat", "and", "rain",
         "and", "the", "long", "road", "home"]


def rows(n: int = 40) -> list[dict[str, str]]:
    """n distinct documents in two genres; ids are stable, texts long enough to tokenize into a few windows."""
    out = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(60 + i)]
        out.append({"id": f"doc-{i:03d}", "text": f"Document {i}. " + " ".join(words) + ".",
                    "genre": GENRES[i % 2], "year": str(1900 + i)})
    return out


def write_parquet(path: Path, records: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def write_jsonl_gz(path: Path, records: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def files_data(tmp_path: Path, paths: list[str], **fields) -> DataConfig:
    return DataConfig.model_validate({"source": "files", "data_dir": str(tmp_path / "data"),
                                      "files": {"paths": paths, **fields}})


def heldout_ids(manifest, domain: str) -> set[str]:
    return {d.id for d in manifest.documents(domain, "heldout")}


@pytest.fixture
def shards(tmp_path: Path) -> dict[str, Path]:
    records = rows()
    return {
        "parquet": write_parquet(tmp_path / "pq" / "part-0.parquet", records[:25]).parent,
        "parquet2": write_parquet(tmp_path / "pq" / "part-1.parquet", records[25:]).parent,
        "jsonl": write_jsonl_gz(tmp_path / "js" / "all.jsonl.gz", records).parent,
    }


def test_parquet_and_jsonl_gz_give_the_same_domains_and_split(tmp_path: Path, shards) -> None:
    logs: list[str] = []
    by_format = {}
    for name, pattern in (("parquet", str(shards["parquet"] / "*.parquet")), ("jsonl", str(shards["jsonl"] / "*"))):
        data = files_data(tmp_path, [pattern], id_field="id", domain_field="genre")
        assert data.domains == []  # unset: every domain the source has
        by_format[name] = prepare_source(data, log=logs.append)
    for manifest in by_format.values():
        assert manifest.available_domains == list(GENRES)
        assert sum(r.train.documents + r.heldout.documents for r in manifest.domains.values()) == 40
        for domain in GENRES:
            ids = [d.id for d in manifest.documents(domain, "train")] + sorted(heldout_ids(manifest, domain))
            assert all(int(i[-3:]) % 2 == GENRES.index(domain) for i in ids)
            assert not heldout_ids(manifest, domain) & {d.id for d in manifest.documents(domain, "train")}
    for domain in GENRES:
        held = heldout_ids(by_format["parquet"], domain)
        assert held == heldout_ids(by_format["jsonl"], domain)
        by_hash = {r["id"] for r in rows() if r["genre"] == domain and heldout_score(r["id"]) < HELDOUT_FRACTION}
        assert by_hash <= held and len(held) == max(MIN_HELDOUT_DOCS, len(by_hash))
    assert by_format["parquet"].data_dir != by_format["jsonl"].data_dir  # each source setting has its own folder


def test_one_domain_and_ids_from_the_text(tmp_path: Path, shards) -> None:
    data = files_data(tmp_path, [str(shards["jsonl"] / "*.jsonl.gz")], domain="stories", max_documents=30)
    manifest = prepare_source(data, log=lambda _: None)
    assert manifest.available_domains == ["stories"]
    record = manifest.domains["stories"]
    assert record.train.documents + record.heldout.documents == 30
    assert all(len(d.id) == 24 for d in manifest.documents("stories", "train"))  # a hash of the text


def test_txt_files_are_one_document_each(tmp_path: Path) -> None:
    for record in rows(6):
        (tmp_path / "txt" / record["genre"]).mkdir(parents=True, exist_ok=True)
        (tmp_path / "txt" / record["genre"] / f"{record['id']}.txt").write_text(record["text"] + "\nmore\n")
    data = files_data(tmp_path, [str(tmp_path / "txt" / "**" / "*.txt")], domain="notes")
    record = prepare_source(data, log=lambda _: None).domains["notes"]
    assert record.train.documents + record.heldout.documents == 6
    (tmp_path / "txt" / "poems" / "doc-001.txt").write_bytes(b"fine\nnot \xff fine\n")
    assert one_message(files_data(tmp_path, [str(tmp_path / "txt" / "**" / "*.txt")], domain="other")).startswith(
        f"{tmp_path / 'txt' / 'poems' / 'doc-001.txt'}:2: not UTF-8")


def test_second_prepare_reads_nothing_and_a_changed_file_is_read_again(tmp_path: Path, shards) -> None:
    data = files_data(tmp_path, [str(shards["parquet"] / "*.parquet")], id_field="id", domain_field="genre")
    first = prepare_source(data, log=lambda _: None)
    split = first.split_path("poems", "train")
    stamp = split.stat().st_mtime_ns
    logs: list[str] = []
    again = prepare_source(data, log=logs.append)
    assert logs == [f"files corpus cached in {corpus_dir(data)} (checksums verified): letters, poems"]
    assert again.domains == first.domains and split.stat().st_mtime_ns == stamp
    write_parquet(shards["parquet"] / "part-1.parquet", rows(50)[25:])
    rebuilt = prepare_source(data, log=lambda _: None)
    assert sum(r.train.documents + r.heldout.documents for r in rebuilt.domains.values()) == 50


def experiment(data: dict) -> ExperimentConfig:
    return experiment_from_dict({**MICRO, "data": {**MICRO["data"], **data}}, "test")


def test_spec_hash_follows_the_files_and_only_them(tmp_path: Path, shards) -> None:
    source = {"source": "files", "data_dir": str(tmp_path / "data"), "domains": [],
              "files": {"paths": [str(shards["parquet"] / "*.parquet")], "id_field": "id"}}
    before = spec_hash(experiment(source))
    assert spec_hash(experiment(source)) == before
    prepare_source(experiment(source).data, log=lambda _: None)  # preparing changes no input
    assert spec_hash(experiment(source)) == before
    write_parquet(shards["parquet"] / "part-1.parquet", rows(41)[25:])
    assert spec_hash(experiment(source)) != before
    # An explicit `source: builtin` is the run it always was.
    assert spec_hash(experiment({"source": "builtin"})) == spec_hash(experiment({}))
    assert "source" not in experiment({}).model_dump(mode="json", exclude_defaults=True)["data"]


def test_hf_source_reads_a_local_folder_of_shards_like_files(tmp_path: Path, shards) -> None:
    hf = DataConfig.model_validate({"source": "hf", "data_dir": str(tmp_path / "data"),
                                    "hf": {"dataset": str(shards["parquet"]), "id_field": "id",
                                           "domain_field": "genre"}})
    files = files_data(tmp_path, [str(shards["parquet"] / "*.parquet")], id_field="id", domain_field="genre")
    from_hf, from_files = prepare_source(hf, log=lambda _: None), prepare_source(files, log=lambda _: None)
    assert from_hf.available_domains == from_files.available_domains == list(GENRES)
    for domain in GENRES:
        assert heldout_ids(from_hf, domain) == heldout_ids(from_files, domain)


# --- bad input: one message each, nothing written -------------------------------------------------------------------


def one_message(data: DataConfig) -> str:
    with pytest.raises(GatelabError) as caught:
        prepare_source(data, log=lambda _: None)
    message = str(caught.value)
    assert "\n" not in message
    assert not corpus_dir(data).exists()
    return message


def test_glob_that_matches_nothing(tmp_path: Path) -> None:
    pattern = str(tmp_path / "nowhere" / "*.parquet")
    message = one_message(files_data(tmp_path, [pattern]))
    assert message == f"data.files.paths: {pattern!r} matches no file"
    with pytest.raises(GatelabError, match="matches no file"):  # before a run starts: its identity needs the files
        spec_hash(experiment({"source": "files", "domains": [], "files": {"paths": [pattern]}}))


def test_cli_train_with_a_bad_glob_is_one_message_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    from tests.helpers import REPO

    pattern = str(tmp_path / "nowhere" / "*.jsonl")
    preset = {**MICRO, "data": {"source": "files", "data_dir": str(tmp_path / "data"), "files": {"paths": [pattern]}}}
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(preset))
    result = subprocess.run([sys.executable, "-m", "gatelab", "train", str(tmp_path / "own.yaml"), "--runs-dir",
                             str(tmp_path / "runs")], capture_output=True, text=True, cwd=REPO, timeout=120,
                            check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: data.files.paths: {pattern!r} matches no file" in " ".join(result.stderr.split())
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_parquet_without_the_text_column_lists_its_columns(tmp_path: Path, shards) -> None:
    bad = write_parquet(tmp_path / "bad" / "z.parquet", [{"body": r["text"], "id": r["id"]} for r in rows(5)])
    message = one_message(files_data(tmp_path, [str(shards["parquet"] / "*.parquet"), str(bad)]))
    assert message == f"{bad}: no column 'text' (data.files.text_field); its columns are body, id"


def test_non_utf8_line_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps(r).encode() for r in rows(6)]
    lines[3] = lines[3].replace(b"Document", b"Docum\xe9nt")
    bad.write_bytes(b"\n".join(lines) + b"\n")
    message = one_message(files_data(tmp_path, [str(bad)]))
    assert message.startswith(f"{bad}:4: not UTF-8")


def test_unreachable_hub_says_how_to_use_downloaded_shards(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = DataConfig.model_validate({"source": "hf", "data_dir": str(tmp_path / "data"),
                                      "hf": {"dataset": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT"}})
    message = one_message(data)
    assert message.startswith("data.hf.dataset 'HuggingFaceFW/fineweb-edu': the Hugging Face Hub cannot be reached")
    assert "data.source: files" in message and "data.files.paths" in message


@pytest.mark.parametrize("data, message", [
    ({"source": "files"}, "data.files.paths is empty"),
    ({"source": "files", "files": {"paths": []}}, "data.files.paths is empty"),
    ({"files": {"paths": ["x.parquet"]}}, "data.source is 'builtin'"),
    ({"source": "hf"}, "data.hf is missing"),
    ({"source": "files", "files": {"paths": ["x"], "domain": "a", "domain_field": "b"}}, "not both"),
    ({"source": "files", "files": {"paths": ["x"], "domain": "../up"}}, "domain"),
    ({"source": "files", "files": {"paths": ["x"]}, "user_files": {"a": ["b"]}}, "data.user_files"),
])
def test_config_checks_the_source_keys(data: dict, message: str) -> None:
    with pytest.raises(GatelabError, match="invalid configuration") as caught:
        experiment(data)
    assert message in str(caught.value)


# --- into training --------------------------------------------------------------------------------------------------


def test_load_data_tokenizes_a_files_source_and_yields_batches(tmp_path: Path, shards) -> None:
    from gatelab.data.budget import CorpusCounter
    from gatelab.data.prepare import load_data
    from gatelab.train.module import StepBatches

    config = experiment({"source": "files", "data_dir": str(tmp_path / "data"), "seq_len": 16, "domains": [],
                         "files": {"paths": [str(shards["jsonl"] / "*.jsonl.gz")], "id_field": "id",
                                   "domain_field": "genre"}})
    assert CorpusCounter()(config.data, 512).how == "unknown"  # not prepared yet: no crash
    tokenizer, corpus, domains = load_data(config, log=lambda *_: None, warn=lambda *_: None)
    assert domains == list(GENRES) and tokenizer is not None
    assert all(len(corpus.tokens(d, "train")) > 0 and len(corpus.tokens(d, "heldout")) > 0 for d in domains)
    assert CorpusCounter()(config.data, 512).how == "exact"
    from gatelab.data.datasets import train_dataset

    windows = train_dataset(corpus, config.data.seq_len, config.seed, domains)
    inputs, targets = next(iter(StepBatches(windows, 4, 8, lambda: 0)))
    assert inputs.shape == targets.shape == (4, 16)
    one = config.model_copy(update={"data": config.data.model_copy(update={"domains": ["poems", "essays"]})})
    with pytest.raises(GatelabError, match="essays not in the files source, whose domains are letters, poems"):
        load_data(one, log=lambda *_: None, warn=lambda *_: None)
