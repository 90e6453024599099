"""`gatelab bench --data`: what gatelab's data path costs, measured side by side with the bare alternative.

A benchmark, not a test: it prints figures and writes a markdown report; the targets are listed with the measured
figure and whether it holds, whatever the outcome.

1. Tokenizing (`tokenizing`). Real text (the prepared built-in corpora found in the data directory, then the running
   Python's own ``.py`` files until the size asked for) is written as parquet shards with ``id`` and ``text`` columns,
   and a byte-level BPE is trained on a sample of it into a tokenizer.json. gatelab's whole prepare
   (`prepare.load_data` with ``data.source: files`` and ``data.tokenizer: <that tokenizer.json>``: parquet rows to
   JSONL split files, then token shards) is timed, and so is its tokenize stage alone (`shards.write_split` of every
   split, timed by the lines `datasets.tokenize_corpus` logs around it). The bare rate is a ``Tokenizer.encode_batch``
   loop (256 documents a batch, ``add_special_tokens=False``) over the very texts gatelab tokenized, read back into
   memory first. The bare loop and gatelab's tokenize stage (its token cache removed each time) are interleaved, round
   after round, in one process: this machine's speed drifts (other work shares its cores) by more than the difference
   measured.
2. Reading at scale. A synthetic corpus of about 1e9 tokens is written once (cached) in the exact layout of
   `gatelab.data.shards` (`synthetic`), and read back as a `TokenCorpus` through `shards.load_split`. The windows/s
   that `StepBatches` delivers (`loader`: directly, and through a DataLoader with 0 and 2 worker processes; with the
   shards in the page cache, and evicted from it, checked with mincore: `page_cache`) are set against the windows/s the
   tiny preset's model consumes when training in fp32 on this CPU. Then a short Lightning training (`TextData`,
   `GatedLM`, a `lightning.Trainer` without logger or checkpoints) runs in a child process per corpus and page-cache
   state (`peak_rss`: the 1e9-token corpus evicted, and a fresh copy of it as a prepare leaves it; a small corpus of
   the same form; the real tiny corpus where it is prepared), each reporting its own peak RSS (VmHWM).

Beside gatelab's reader the bench sets a memory-mapped one (`loader.MemmapStream`) and probes how many resident MB a
random window maps (`loader.folio_probe`); part 1 also replays `shards._write_shard`'s steps one at a time and runs
short back-to-back pairs on a slice (`tokenizing.tokenize_profile`, `tokenizing.paired_tokenize`).

`measure` runs the parts in order (`bench_data`) and reads off the targets; `render` writes data.md and data.json.
"""
