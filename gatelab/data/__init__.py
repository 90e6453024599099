"""Offline corpora in named domains, a locally trained byte-level BPE, and seed-ordered token datasets."""
