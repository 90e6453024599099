"""What the corpora, their sources and the token datasets share: a Document, the Artifact it came from, DataError."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gatelab.errors import GatelabError

Log = Callable[[str], None]


class DataError(GatelabError):
    """A data problem the user can fix: the message names the file, what is wrong and what would be valid."""


@dataclass(frozen=True)
class Document:
    """One unit of text that is never split across train and held-out."""

    id: str
    text: str
    meta: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "text": self.text, "meta": self.meta}, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str, where: str) -> Document:
        try:
            obj = json.loads(line)
            return cls(id=str(obj["id"]), text=str(obj["text"]), meta=dict(obj.get("meta", {})))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(
                f"{where}: not a document line ({exc}); expected JSON with 'id', 'text' and 'meta'. "
                "Delete the data directory's corpora/ folder and prepare again."
            ) from exc


@dataclass(frozen=True)
class Artifact:
    """A downloaded file (relative to the data directory) or a local input (absolute path), with its sha256."""

    file: str
    sha256: str


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
