"""What `gatelab bench --data` measures at which size, and the report it fills (data.json holds it as it is)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The two readers of the loader rows: gatelab's own, and the memory-mapped one set beside it for comparison.
GATELAB_READER, MEMMAP_READER = "gatelab TokenStream", "np.memmap (comparison)"


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is; `QUICK` is for tests and a first look."""

    text_mb: float = 32.0  # real text to tokenize
    vocab: int = 4096  # the BPE trained for part 1 (tiny.yaml's model.vocab_size)
    rounds: int = 3  # interleaved rounds of (bare loop, gatelab tokenize stage) after the first whole prepare
    paired_mb: float = 3.0  # then write_split and the bare loop on one slice of this size, alternated in pairs:
    pairs: int = 8  # short pairs see the same machine load, where a whole pass each does not
    large_tokens: int = 1_000_000_000
    small_tokens: int = 8_000_000
    heldout_tokens: int = 1_000_000
    shard_tokens: int = 1 << 24  # about 64 MiB of JSONL text, as gatelab's default data.shard_mb
    loader_batches: int = 400  # batches per warm loader measurement
    cold_batches: int = 150
    train_warmup: int = 2
    train_steps: int = 6
    rss_steps: int = 30
    tiny: bool = True  # also the real tiny corpus for the peak-RSS comparison


QUICK = Sizes(text_mb=1.0, rounds=1, paired_mb=0.3, pairs=2, large_tokens=16_000_000, small_tokens=2_000_000,
              heldout_tokens=200_000, shard_tokens=1 << 22, loader_batches=60, cold_batches=30, train_warmup=1,
              train_steps=2, rss_steps=4, tiny=False)


@dataclass
class DataBenchReport:
    machine: dict
    sizes: dict
    command: str = ""
    scratch: str = ""
    tokenize: dict = field(default_factory=dict)
    scale: dict = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def fmt(value, digits: int = 3) -> str:
    """A figure as the data bench writes it: thousands grouped, `digits` significant below 1,000, n/a for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return f"{value:,}" if isinstance(value, int) else str(value)
