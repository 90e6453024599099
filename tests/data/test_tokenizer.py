"""Tokenizer: lossless round trip, special ids, training on the training split only, cache by content hash."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gatelab.data import tokenizer as tokmod
from gatelab.data.corpora import CorpusManifest, DataError, domains_from_files
from gatelab.data.tokenizer import (
    BOS,
    EOS,
    PAD,
    bos_id,
    bytes_per_token,
    eos_id,
    load_or_train_tokenizer,
    pad_id,
    tokenizer_fingerprint,
    tokenizer_key,
    training_texts,
)
from tests.helpers import write_foreign_tokenizer

VOCAB = 320


def write_domain(root: Path, domain: str, words: list[str], n_docs: int, seed: int) -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for i in range(n_docs):
        path = root / domain / f"doc{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = (" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(20 + i))
        path.write_text(f"{domain} document {i}\n" + "\n".join(lines), encoding="utf-8")
        paths.append(path)
    return paths


@pytest.fixture
def manifest(tmp_path: Path) -> CorpusManifest:
    prose = "the whale sea ship captain night naïve café — “quoted” words".split()
    code = "def return self if else for in None import class lambda ( ) : = +".split()
    files = {
        "prose": write_domain(tmp_path / "in", "prose", prose, 20, 1),
        "snippets": write_domain(tmp_path / "in", "snippets", code, 20, 2),
    }
    return domains_from_files(files, tmp_path / "data", log=lambda _: None)


def test_round_trip_and_special_ids(manifest: CorpusManifest) -> None:
    tok = load_or_train_tokenizer(manifest, VOCAB, log=lambda _: None)
    assert tok.get_vocab_size() == VOCAB
    assert (bos_id(tok), eos_id(tok), pad_id(tok)) == tuple(tok.token_to_id(t) for t in (BOS, EOS, PAD))
    assert len({bos_id(tok), eos_id(tok), pad_id(tok)}) == 3
    for text in ["the whale\n\tdef f(x): return x", "naïve café — “日本語” 🐋", "  leading spaces\r\n"]:
        assert tok.decode(tok.encode(text).ids) == text
    # Merges were learned: frequent words take fewer tokens than their bytes.
    assert len(tok.encode("the whale").ids) < len(b"the whale")


def test_second_call_loads_from_cache(manifest: CorpusManifest, monkeypatch: pytest.MonkeyPatch) -> None:
    logs: list[str] = []
    first = load_or_train_tokenizer(manifest, VOCAB, log=logs.append)
    key = tokenizer_key(manifest, VOCAB, manifest.available_domains)
    assert (manifest.data_dir / "tokenizers" / key / "tokenizer.json").is_file()

    def no_training(*_: object) -> None:
        raise AssertionError("the cached tokenizer should have been loaded, not trained")

    monkeypatch.setattr(tokmod, "_train_tokenizer", no_training)
    second = load_or_train_tokenizer(manifest, VOCAB, log=logs.append)
    assert tokenizer_fingerprint(second) == tokenizer_fingerprint(first)
    assert "loaded" in logs[-1]


def swap_two_tokens(text: str) -> str:
    """The tokenizer.json with two vocabulary ids swapped: it still loads, as another tokenizer."""
    raw = json.loads(text)
    vocab = raw["model"]["vocab"]
    first, second = sorted(vocab)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    return json.dumps(raw)


@pytest.mark.parametrize("damage", [lambda text: text[: len(text) // 2], swap_two_tokens], ids=["truncated", "edited"])
def test_a_damaged_cached_tokenizer_is_trained_again(manifest: CorpusManifest, damage) -> None:
    first = load_or_train_tokenizer(manifest, VOCAB, log=lambda _: None)
    path = manifest.data_dir / "tokenizers" / tokenizer_key(manifest, VOCAB, manifest.available_domains) / (
        "tokenizer.json")
    text = path.read_text(encoding="utf-8")
    path.write_text(damage(text), encoding="utf-8")
    logs: list[str] = []
    again = load_or_train_tokenizer(manifest, VOCAB, log=logs.append)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(first)
    assert path.read_text(encoding="utf-8") == text
    assert logs[0] == (f"{path}: its sha256 is not the one recorded when it was trained (damaged since); training it "
                       "again"), logs


def test_a_broken_tokenizer_cached_before_checksums_is_trained_again(manifest: CorpusManifest) -> None:
    first = load_or_train_tokenizer(manifest, VOCAB, log=lambda _: None)
    folder = manifest.data_dir / "tokenizers" / tokenizer_key(manifest, VOCAB, manifest.available_domains)
    (folder / "tokenizer.sha256").unlink(missing_ok=True)
    (folder / "tokenizer.json").write_text("{", encoding="utf-8")
    logs: list[str] = []
    again = load_or_train_tokenizer(manifest, VOCAB, log=logs.append)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(first)
    assert logs[0].startswith(f"{folder / 'tokenizer.json'}: not a tokenizer the tokenizers library can load ("), logs
    assert (folder / "tokenizer.sha256").is_file()


def test_cache_key_follows_vocab_domains_and_settings(manifest: CorpusManifest) -> None:
    domains = manifest.available_domains
    base = tokenizer_key(manifest, VOCAB, domains)
    assert base == tokenizer_key(manifest, VOCAB, list(reversed(domains)))
    assert base != tokenizer_key(manifest, VOCAB + 1, domains)
    assert base != tokenizer_key(manifest, VOCAB, ["prose"])
    assert base != tokenizer_key(manifest, VOCAB, domains, max_chars_per_domain=1000)


def test_training_reads_only_the_training_split(manifest: CorpusManifest) -> None:
    texts = list(training_texts(manifest, manifest.available_domains, max_chars_per_domain=10**9))
    train_texts = {d.text for domain in manifest.available_domains for d in manifest.documents(domain, "train")}
    heldout_texts = {d.text for domain in manifest.available_domains for d in manifest.documents(domain, "heldout")}
    assert set(texts) == train_texts and not set(texts) & heldout_texts
    capped = list(training_texts(manifest, ["prose"], max_chars_per_domain=500))
    assert sum(map(len, capped)) == 500


def test_vocab_size_too_small_is_a_clean_error(manifest: CorpusManifest) -> None:
    with pytest.raises(DataError, match="vocab_size 100"):
        load_or_train_tokenizer(manifest, 100)


# --- data.tokenizer: a tokenizer.json file or a Hugging Face name ---------------------------------------------------


def write_experiment(tmp_path: Path, tokenizer: str, vocab_size: object = "auto", **data: object) -> Path:
    import yaml

    from tests.helpers import DENSE

    tree = {**DENSE, "model": {**DENSE["model"], "vocab_size": vocab_size},
            "data": {**DENSE["data"], "tokenizer": tokenizer, **data}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    return write_foreign_tokenizer(tmp_path / "tok" / "tokenizer.json")


def test_a_tokenizer_file_sets_vocab_size_auto_and_frames_with_its_end_of_text(tmp_path: Path, foreign: Path) -> None:
    from gatelab.config import flatten
    from gatelab.data.resolve import load_experiment

    loaded = tokmod.load_foreign_tokenizer(str(foreign))
    assert 256 < loaded.vocab_size <= 300
    assert loaded.bos == loaded.eos == "<|endoftext|>"  # no BOS of its own: the EOS serves both, as GPT-2 and Qwen
    experiment = load_experiment(write_experiment(tmp_path, str(foreign)))
    assert experiment.model.vocab_size == 384  # rounded up to a multiple of 128
    assert flatten(experiment)["model.vocab_size"] == 384
    assert load_experiment(write_experiment(tmp_path, str(foreign), vocab_size=300)).model.vocab_size == 300


def test_the_spec_hash_follows_the_file_content_not_its_path(tmp_path: Path, foreign: Path) -> None:
    import shutil

    from gatelab.data.identity import spec_hash
    from gatelab.data.resolve import load_experiment

    first = spec_hash(load_experiment(write_experiment(tmp_path, str(foreign))))
    moved = tmp_path / "elsewhere" / "renamed.json"
    moved.parent.mkdir()
    shutil.move(foreign, moved)
    assert spec_hash(load_experiment(write_experiment(tmp_path, str(moved)))) == first
    moved.write_text(moved.read_text() + "\n")  # any edit is another tokenizer as far as identity goes
    assert spec_hash(load_experiment(write_experiment(tmp_path, str(moved)))) != first
    bpe = spec_hash(load_experiment(write_experiment(tmp_path, "bpe", vocab_size=384)))
    assert bpe != first


def test_a_tokenizer_larger_than_the_model_vocabulary_is_one_error(tmp_path: Path, foreign: Path) -> None:
    from gatelab.data.resolve import load_experiment
    from gatelab.errors import GatelabError

    size = tokmod.load_foreign_tokenizer(str(foreign)).vocab_size
    with pytest.raises(GatelabError) as error:
        load_experiment(write_experiment(tmp_path, str(foreign), vocab_size=256))
    message = str(error.value)
    assert f"data.tokenizer {foreign} has {size} tokens" in message
    assert "model.vocab_size (256)" in message and "auto" in message and "384" in message


def test_auto_needs_a_tokenizer_to_take_the_size_from(tmp_path: Path) -> None:
    from gatelab.data.resolve import load_experiment
    from gatelab.errors import GatelabError

    with pytest.raises(GatelabError, match=r"model.vocab_size 'auto'.*data.tokenizer"):
        load_experiment(write_experiment(tmp_path, "bpe"))
    with pytest.raises(GatelabError, match=r"model.vocab_size 'auto'.*bigram_backcopy"):
        load_experiment(write_experiment(tmp_path, "bpe", task="bigram_backcopy"))
    with pytest.raises(GatelabError, match=r"data.bos_token and data.eos_token"):
        load_experiment(write_experiment(tmp_path, "bpe", vocab_size=320, eos_token="<|endoftext|>"))


def test_a_missing_or_broken_tokenizer_file_names_key_and_path(tmp_path: Path) -> None:
    from gatelab.data.resolve import load_experiment
    from gatelab.errors import GatelabError

    absent = tmp_path / "absent" / "tokenizer.json"
    with pytest.raises(GatelabError, match=rf"data.tokenizer: {absent}: no such file") as error:
        load_experiment(write_experiment(tmp_path, str(absent)))
    assert "\n" not in str(error.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"not": "a tokenizer"}')
    with pytest.raises(GatelabError, match=rf"data.tokenizer: {broken}: not a tokenizer.json"):
        load_experiment(write_experiment(tmp_path, str(broken)))


def test_framing_tokens_can_be_named_and_must_exist(tmp_path: Path, foreign: Path) -> None:
    from gatelab.data.resolve import load_experiment
    from gatelab.errors import GatelabError

    with pytest.raises(GatelabError, match=r"data.eos_token: '</s>' is not a token"):
        load_experiment(write_experiment(tmp_path, str(foreign), eos_token="</s>"))
    # A tokenizer without any end-of-text token needs data.eos_token.
    from tokenizers import Tokenizer, models

    bare = tmp_path / "bare.json"
    Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]")).save(str(bare))
    with pytest.raises(GatelabError, match=r"none of the end-of-document tokens.*data.eos_token"):
        load_experiment(write_experiment(tmp_path, str(bare)))
    experiment = load_experiment(write_experiment(tmp_path, str(bare), eos_token="b", bos_token="a"))
    assert experiment.model.vocab_size == 128


def test_a_hub_name_offline_is_one_line_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from gatelab.data.resolve import load_experiment
    from gatelab.errors import GatelabError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # fails at once instead of waiting on the network
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # gatelab's own reachability check answers without the network too
    assert tokmod.is_hub_name("Qwen/Qwen3-0.6B") and not tokmod.is_hub_name("tok/tokenizer.json")
    with pytest.raises(GatelabError) as error:
        load_experiment(write_experiment(tmp_path, "Qwen/Qwen3-0.6B"))
    message = str(error.value)
    assert "\n" not in message
    assert "data.tokenizer: Qwen/Qwen3-0.6B" in message
    assert "huggingface.co/Qwen/Qwen3-0.6B/resolve/main/tokenizer.json" in message
    assert "set data.tokenizer: /path/to/tokenizer.json" in message and "HF_HUB_OFFLINE is set" in message


def test_load_data_tokenizes_with_the_file_tokenizer(tmp_path: Path, foreign: Path) -> None:
    from gatelab.data.budget import CorpusCounter
    from gatelab.data.prepare import load_data
    from gatelab.data.resolve import load_experiment

    files = {"prose": [str(p) for p in write_domain(tmp_path / "in", "prose", "river stone quiet".split(), 12, 4)]}
    path = write_experiment(tmp_path, str(foreign), domains=["prose"], data_dir=str(tmp_path / "data"),
                            user_files=files)
    experiment = load_experiment(path)
    tokenizer, corpus, domains = load_data(experiment, log=lambda *_: None, warn=lambda *_: None)
    loaded = tokmod.load_foreign_tokenizer(str(foreign))
    assert domains == ["prose"]
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(loaded.tokenizer)
    assert corpus.directory == tmp_path / "data" / "tokens" / tokenizer_fingerprint(loaded.tokenizer)
    end = tokenizer.token_to_id("<|endoftext|>")
    assert corpus.bos_id == corpus.eos_id == end
    train = corpus.get("prose", "train")
    for i in range(len(train.doc_ids)):
        ids = train.document(i)
        assert ids[0] == end and ids[-1] == end and end not in ids[1:-1].tolist()
    assert int(max(train.tokens)) < experiment.model.vocab_size
    count = CorpusCounter()(experiment.data, experiment.model.vocab_size)  # the plan's count: now this cache, exactly
    assert (count.tokens, count.how) == (len(train.tokens), "exact")


@pytest.mark.slow
def test_gatelab_train_on_a_bad_tokenizer_exits_2_with_one_message_and_writes_nothing(
    tmp_path: Path, foreign: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import train_cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the subprocess fails at once instead of waiting on the network
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cases = {
        "too large": (str(foreign), 256, "more than model.vocab_size (256)"),
        "hub name offline": ("Qwen/Qwen3-0.6B", "auto", "set data.tokenizer: /path/to/tokenizer.json"),
    }
    for name, (tokenizer, vocab_size, expected) in cases.items():
        case = tmp_path / name.replace(" ", "_")
        case.mkdir()
        result = train_cli(write_experiment(case, tokenizer, vocab_size=vocab_size), case / "runs")
        output = result.stdout + result.stderr
        assert result.returncode == 2, (name, output)
        assert output.count("error:") == 1 and expected in output and "Traceback" not in output, (name, output)
        assert not (case / "runs").exists(), name


MULTI_BYTE = ["café — 日本", "naïve “quoted” 🐋 words", "def f(x):\n\treturn x  # ünïcode"]


def test_bytes_per_token_sum_to_the_texts_utf8_bytes(manifest: CorpusManifest, foreign: Path) -> None:
    """Split multi-byte characters included: a token holding half of 'é' has 1 byte, not U+FFFD's 3."""
    from tokenizers import Tokenizer

    for tok in (load_or_train_tokenizer(manifest, VOCAB, log=lambda _: None), Tokenizer.from_file(str(foreign))):
        table = bytes_per_token(tok)
        assert table is not None and len(table) == tok.get_vocab_size(with_added_tokens=True)
        for text in MULTI_BYTE:
            ids = tok.encode(text).ids
            assert sum(table[ids]) == len(text.encode("utf-8")), text
        specials = [tok.token_to_id(t) for t in (BOS, EOS, PAD, "<|endoftext|>") if tok.token_to_id(t) is not None]
        assert specials and all(table[i] == 0 for i in specials)


def test_a_tokenizer_that_is_not_byte_level_has_no_bytes_table() -> None:
    """SentencePiece-style: a '▁' for a space that decoding strips at the start, so a token's bytes are not fixed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={"▁a": 0, "b": 1}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    assert bytes_per_token(tokenizer) is None
