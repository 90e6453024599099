"""Text from outside gatelab: the user's files (`data.source: files`) or a Hugging Face Hub dataset (`data.source: hf`).

Both are read with the `datasets` library, streamed (`load_dataset(..., streaming=True)`), one row at a time: a corpus
never has to fit in memory. Each document goes straight to its split file through `corpora.DomainWriter`, so the
tokenizer and token streams read these corpora exactly as they read the built-in ones, through a `CorpusManifest`.

Each source setting gets a folder of its own, ``<data_dir>/external/<source>-<key>/`` (key: a hash of the
`data.files` or `data.hf` block), holding its manifest, corpora, tokenizers and tokens. A folder of its own because
the source's domain names are the user's (a column's values) and must never overwrite a built-in domain of the same
name in the shared manifest.

Caching: the manifest's source record keeps a fingerprint of the settings and of every file's (path, size, mtime);
while it matches and the split files have their checksums, `prepare_source` reads nothing. (Path, size, mtime) rather
than a checksum of the shards, because hashing gigabytes of parquet on every run is what the cache is there to avoid;
`touch`ing a file therefore counts as a change. `source_identity` is the same record, for the run's spec hash.

Bad input is one `DataError` before anything is kept: a glob that matches nothing, a file without the text column
(its columns are listed), a line that is not UTF-8 (file and line), a Hub that cannot be reached (how to use
downloaded shards instead).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gatelab.config import CorpusFields, DataConfig, FilesSourceConfig, HFSourceConfig
from gatelab.data.corpora import (
    CorpusManifest,
    DataError,
    Document,
    DomainWriter,
    Log,
    SourceRecord,
    default_data_dir,
)
from gatelab.data.hub import hub_unreachable

# The `datasets` builder for each file type. A .txt file is one document (sample_by="document"), as in
# data.user_files: a line is rarely a document.
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".jsonl.gz": "json", ".json": "json", ".txt": "text"}
# A domain_field with more values than this is an id-like column, not a set of evaluation domains.
MAX_DOMAINS = 64
_DOMAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def _settings(data: DataConfig) -> CorpusFields:
    settings = data.files if data.source == "files" else data.hf
    if settings is None:
        raise DataError(f"data.source is {data.source!r} but data.{data.source} is missing")
    return settings


def corpus_dir(data: DataConfig) -> Path:
    """The source's own data folder (see the module docstring); cheap: reads no file."""
    root = Path(data.data_dir).expanduser() if data.data_dir else default_data_dir()
    payload = json.dumps({"source": data.source, **_settings(data).model_dump(mode="json")}, sort_keys=True)
    return root / "external" / f"{data.source}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


def _builder(path: Path) -> str:
    for suffix, builder in BUILDERS.items():
        if path.name.endswith(suffix):
            return builder
    raise DataError(f"data.files.paths: {path} is not one of the readable types ({', '.join(BUILDERS)})")


def resolve_files(files: FilesSourceConfig) -> list[Path]:
    """The files the globs name, sorted and without repeats; a glob that matches no file is an error."""
    found: dict[Path, None] = {}
    for pattern in files.paths:
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True))
        matches = [p.resolve() for p in matches if p.is_file()]
        if not matches:
            raise DataError(f"data.files.paths: {pattern!r} matches no file")
        for path in matches:
            _builder(path)
            found[path] = None
    return sorted(found)


def _stats(paths: list[Path]) -> list[list[Any]]:
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]


def source_identity(data: DataConfig) -> dict[str, Any]:
    """The source as the run's spec hash sees it: its settings, and (files) every file's path, size and mtime, or
    (hf) the dataset's id, config, split and revision, plus its files' when `dataset` is a local folder."""
    settings = _settings(data).model_dump(mode="json")
    if data.source == "files":
        settings["paths"] = _stats(resolve_files(data.files))
    elif Path(data.hf.dataset).expanduser().is_dir():
        folder = Path(data.hf.dataset).expanduser()
        settings["local_files"] = _stats(sorted(p.resolve() for p in folder.rglob("*") if p.is_file()))
    return settings


# --- reading --------------------------------------------------------------------------------------------------------


def _quiet_datasets():
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _first_bad_line(path: Path) -> tuple[int, str] | None:
    """(line number, reason) of the first line of a text file (gzip or plain) that is not UTF-8, else None."""
    with (gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")) as f:
        for lineno, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return lineno, exc.reason
    return None


def _columns(dataset) -> list[str]:
    if dataset.column_names is not None:
        return list(dataset.column_names)
    first = next(iter(dataset), None)
    return list(first) if first is not None else []


def _check_columns(columns: list[str], fields: CorpusFields, key: str, where: str) -> None:
    for name in ("text_field", "id_field", "domain_field"):
        column = getattr(fields, name)
        if column is not None and column not in columns:
            raise DataError(f"{where}: no column {column!r} ({key}.{name}); its columns are "
                            f"{', '.join(columns) or 'none'}")


def _file_rows(files: FilesSourceConfig) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file, row) for every row of every file, after checking every file's columns (so a bad shard at the end fails
    before anything is written)."""
    datasets = _quiet_datasets()
    paths = resolve_files(files)
    opened = []
    for path in paths:
        builder = _builder(path)
        extra = {"sample_by": "document"} if builder == "text" else {}
        try:
            dataset = datasets.load_dataset(builder, data_files=[str(path)], split="train", streaming=True, **extra)
            columns = _columns(dataset)
        except UnicodeDecodeError:
            raise _utf8_error(path) from None
        except Exception as exc:  # noqa: BLE001  pyarrow and datasets raise many types for a malformed file
            raise DataError(f"{path}: unreadable as {builder} ({type(exc).__name__}: {_first_line(exc)})") from None
        if builder == "text":  # one column, the file's whole text: text_field names a column of the other types
            if files.id_field or files.domain_field:
                raise DataError(f"{path}: a .txt file has no columns for data.files.id_field or domain_field; "
                                "give ids and domains in .jsonl or .parquet files")
        else:
            _check_columns(columns, files, "data.files", str(path))
        opened.append((path, dataset, builder))
    for path, dataset, builder in opened:
        try:
            for row in dataset:
                if builder == "text" and files.text_field != "text":
                    row = {files.text_field: row["text"]}
                yield path.name, row
        except UnicodeDecodeError:
            raise _utf8_error(path) from None


def _utf8_error(path: Path) -> DataError:
    bad = _first_bad_line(path)
    where = f"{path}:{bad[0]}" if bad else str(path)
    reason = bad[1] if bad else "invalid byte"
    return DataError(f"{where}: not UTF-8 ({reason}); save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _offline_hint(hf: HFSourceConfig, reason: str) -> DataError:
    # The config's folder in the repository is the dataset's own choice (fineweb-edu keeps sample-10BT in sample/10BT),
    # so the hint names the config rather than guess an --include pattern.
    which = f" (the files of config {hf.config!r}, with --include)" if hf.config else ""
    return DataError(
        f"data.hf.dataset {hf.dataset!r}: the Hugging Face Hub cannot be reached ({reason}); download its shards "
        f"where it can be (huggingface-cli download {hf.dataset} --repo-type dataset --local-dir DIR{which}), then "
        "set data.source: files and data.files.paths: ['DIR/**/*.parquet']"
    )


def _check_hub(hf: HFSourceConfig) -> None:
    """Fail in seconds when the Hub is out of reach: `datasets` itself retries for about half a minute."""
    reason = hub_unreachable()
    if reason is not None:
        raise _offline_hint(hf, reason)


def _hub_rows(hf: HFSourceConfig) -> Iterator[tuple[str, dict[str, Any]]]:
    datasets = _quiet_datasets()
    local = Path(hf.dataset).expanduser().is_dir()
    if not local:
        _check_hub(hf)
    where = f"data.hf.dataset {hf.dataset!r}" + (f" ({hf.config}, {hf.split})" if hf.config else f" ({hf.split})")
    try:
        dataset = datasets.load_dataset(str(Path(hf.dataset).expanduser()) if local else hf.dataset, hf.config,
                                        split=hf.split, streaming=True, revision=hf.revision)
        columns = _columns(dataset)
    except ConnectionError as exc:
        raise _offline_hint(hf, _first_line(exc)) from None
    except Exception as exc:  # noqa: BLE001  unknown dataset, config or split: datasets has no common error type
        raise DataError(f"{where}: cannot be loaded ({type(exc).__name__}: {_first_line(exc)})") from None
    _check_columns(columns, hf, "data.hf", where)
    try:
        for row in dataset:
            yield hf.dataset, row
    except ConnectionError as exc:
        raise _offline_hint(hf, _first_line(exc)) from None


def _documents(data: DataConfig, log: Log) -> Iterator[tuple[str, Document]]:
    """(domain, document) in the source's order, at most max_documents; empty texts are skipped."""
    fields = _settings(data)
    rows = _file_rows(data.files) if data.source == "files" else _hub_rows(data.hf)
    kept = skipped = 0
    for where, row in rows:
        if fields.max_documents is not None and kept >= fields.max_documents:
            break
        text = row.get(fields.text_field)
        if text is None or (isinstance(text, str) and not text.strip()):
            skipped += 1
            continue
        if not isinstance(text, str):
            raise DataError(f"{where}: column {fields.text_field!r} (data.{data.source}.text_field) holds "
                            f"{type(text).__name__}, not text")
        doc_id = str(row[fields.id_field]) if fields.id_field else hashlib.sha256(text.encode()).hexdigest()[:24]
        domain = str(row[fields.domain_field]) if fields.domain_field else fields.domain
        if not _DOMAIN_NAME.fullmatch(domain):
            raise DataError(f"{where}: {fields.domain_field!r} value {domain!r} (data.{data.source}.domain_field) "
                            "is not a usable domain name: letters, digits, '_', '.', '-'")
        kept += 1
        yield domain, Document(doc_id, text, {"source": where})
    if skipped:
        log(f"skipped {skipped:,} row(s) with empty text")


# --- preparing ------------------------------------------------------------------------------------------------------


def prepare_source(data: DataConfig, log: Log = print) -> CorpusManifest:
    """Stream the `files` or `hf` source into split files in its own folder (`corpus_dir`); return its manifest. On
    bad input the error comes before a manifest is saved, and a folder this call created is removed."""
    root = corpus_dir(data)
    fingerprint = hashlib.sha256(json.dumps(source_identity(data), sort_keys=True).encode()).hexdigest()[:16]
    manifest = CorpusManifest.load(root)
    record = manifest.sources.get(data.source)
    if record is not None and record.version == fingerprint and all(manifest.is_valid(d) for d in record.domains):
        log(f"{data.source} corpus cached in {root} (checksums verified): {', '.join(record.domains)}")
        return manifest

    log(f"preparing the {data.source} corpus in {root}")
    created = not root.exists()
    writers: dict[str, DomainWriter] = {}
    try:
        for domain, doc in _documents(data, log):
            if domain not in writers:
                if len(writers) == MAX_DOMAINS:
                    raise DataError(f"data.{data.source}.domain_field {_settings(data).domain_field!r} has more than "
                                    f"{MAX_DOMAINS} values: name a column with a few evaluation domains, or unset it")
                writers[domain] = DomainWriter(root / "corpora" / domain, domain)
            writers[domain].add(doc)
        if not writers:
            raise DataError(f"data.{data.source}: no document with text in column {_settings(data).text_field!r}")
        fresh = CorpusManifest(data_dir=root)
        for domain in sorted(writers):
            fresh.domains[domain] = writers.pop(domain).close(root, (data.source,))
    except BaseException:
        for writer in writers.values():
            writer.abort()
        if created:
            shutil.rmtree(root, ignore_errors=True)
        raise
    fresh.sources[data.source] = SourceRecord(fingerprint, tuple(fresh.domains), ())
    fresh.save()
    log(fresh.summary())
    return fresh
