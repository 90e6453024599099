"""Significance and agreement statistics for the report tables: is a variant's difference from baseline real, how small
a difference could these seeds have seen, and do our results rank and move like the paper's?

Runs of different variants with the same seed share data order and initialisation ("common random numbers"), so they
are compared paired by seed: the noise they share cancels in the per-seed differences. A diverged run's NaN (or inf)
is dropped, never averaged. All statistics come from `scipy.stats`; this module chooses the test, states a reason for
the degenerate cases (one seed, zero spread) instead of a NaN, and turns a test's power into "minimum detectable
effect" and "seeds needed", which tell "no effect" from "too few seeds".
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import optimize, stats

PAIRED = "paired t"
WELCH = "Welch t"
TestName = Literal["paired t", "Welch t"]

# A spread this small relative to the values' magnitude is floating-point residue (10.3 - 10.2 != 20.3 - 20.2 in
# binary), not noise: the t statistic would be a huge number made of rounding error, so such a spread counts as zero.
_ZERO_SPREAD = 1e-12


@dataclass(frozen=True)
class Comparison:
    """A variant against baseline over seeds; `reason` says why `p_value` is None.

    n: the number of pairs; for Welch the *smaller* group's size, with which `mde` and `seeds_needed` err on the side of
        "undetectable" rather than overstate what an unbalanced design could see.
    sd: of the paired differences (ddof=1); for Welch sqrt((s_v^2 + s_b^2) / 2), for which two groups of n give
        Welch's standard error sd * sqrt(2/n).
    mde, seeds_needed: at two-sided alpha 0.05 and power 0.8 (`minimum_detectable_effect`, `seeds_needed`).
    """

    delta: float
    p_value: float | None
    test: TestName
    n: int
    sd: float | None
    mde: float | None
    seeds_needed: int | None
    reason: str | None = None
    correlation: float | None = None  # Pearson's r over the shared seeds (`compare_shared_seeds` only)
    interval: tuple[float, float] | None = None  # the paired test's 95% interval of delta


def _finite(values: Iterable[float]) -> np.ndarray:
    """The finite values as float64: a diverged run's NaN/inf is not a measurement and must not reach a mean."""
    array = np.asarray([float(v) for v in values], dtype=np.float64)
    return array[np.isfinite(array)]


def _is_zero_spread(sd: float, *samples: np.ndarray) -> bool:
    """Whether `sd` is zero up to floating-point residue relative to the magnitude of the values it came from."""
    scale = max((float(np.max(np.abs(s))) for s in samples if s.size), default=0.0)
    return sd <= _ZERO_SPREAD * max(scale, 1.0)


@contextmanager
def _exact_zero_spread_ok() -> Iterator[None]:
    """Silence SciPy's "Precision loss" warning around a t-test: one sample without spread is legitimate for Welch,
    and an all-zero spread is caught before any test runs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        yield


def mean_std(values: Iterable[float]) -> tuple[float, float | None, int]:
    """(mean, std with ddof=1, n) of the finite values: the std is None for n = 1 and the mean NaN for n = 0, so a
    caller can tell "no runs finished" from "one run"."""
    finite = _finite(values)
    n = int(finite.size)
    if n == 0:
        return math.nan, None, 0
    mean = float(np.mean(finite))
    return mean, (float(np.std(finite, ddof=1)) if n > 1 else None), n


def _power(noncentrality: float, df: float, alpha: float) -> float:
    """Two-sided power of a t-test: P(|T'| > t_crit) with T' ~ noncentral t(df, noncentrality).

    The lower tail P(T' < -t_crit) is taken as P(-T' > t_crit) = nct.sf(t_crit, df, -noncentrality) (-T' is noncentral
    t with the opposite sign): SciPy's `nct.cdf` returns NaN far out in that tail (e.g. df 1, noncentrality > 7.5)
    where `nct.sf` of the mirrored distribution stays finite.
    """
    critical = stats.t.ppf(1.0 - alpha / 2.0, df)
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality))


def minimum_detectable_effect(sd: float | None, n: int, paired: bool = True, alpha: float = 0.05,
                              power: float = 0.8) -> float | None:
    """The smallest true |difference| a two-sided t-test at level `alpha` detects with probability `power`.

    Paired: n differences, standard error sd/sqrt(n), df n-1. Welch (two groups of n, both with sd `sd`): standard
    error sd*sqrt(2/n), df 2n-2. Power rises monotonically with the noncentrality lambda, so `brentq` finds the lambda
    whose power is `power`; the effect is lambda times the standard error. At small n the t-distribution's heavy tails
    make it well above the normal-theory 2.80 * SE, which is the point of computing it. None when n < 2 or `sd` is
    unknown, not finite or zero (a zero spread among a few seeds is a degenerate estimate, not an absence of noise).
    """
    if not 0.0 < alpha < 1.0 or not alpha < power < 1.0:
        raise ValueError(f"need 0 < alpha < power < 1; got alpha={alpha}, power={power}")
    if sd is None or not math.isfinite(sd) or sd <= 0.0 or n < 2:
        return None
    df = float(n - 1) if paired else float(2 * n - 2)
    standard_error = sd / math.sqrt(n) if paired else sd * math.sqrt(2.0 / n)
    # Bracket the root: power(0) = alpha < power; widen the upper end until the power is reached (df = 1 needs a
    # noncentrality far beyond the normal approximation's t_crit + z_power).
    high = float(stats.t.ppf(1.0 - alpha / 2.0, df) + stats.norm.ppf(power)) + 1.0
    while _power(high, df, alpha) < power:
        high *= 2.0
        if high > 1e9:  # pragma: no cover - unreachable for valid alpha and power
            return None
    noncentrality = optimize.brentq(lambda lam: _power(lam, df, alpha) - power, 0.0, high, xtol=1e-10, rtol=1e-12)
    return float(noncentrality * standard_error)


def seeds_needed(delta: float, sd: float | None, paired: bool = True, alpha: float = 0.05, power: float = 0.8,
                 max_n: int = 10_000) -> int | None:
    """The smallest n >= 2 (pairs if `paired`, else per group) whose minimum detectable effect is <= |delta|, by
    bisection (the MDE falls with n); None when delta is 0 or not finite, `sd` unusable, or `max_n` would not do."""
    if not math.isfinite(delta) or delta == 0.0 or sd is None or not math.isfinite(sd) or sd <= 0.0:
        return None
    target = abs(delta)

    def enough(n: int) -> bool:
        mde = minimum_detectable_effect(sd, n, paired, alpha, power)
        return mde is not None and mde <= target

    if not enough(max_n):
        return None
    low, high = 2, max_n  # invariant: enough(high); the answer lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle + 1
    return high


def compare(variant: Mapping[int, float], baseline: Mapping[int, float]) -> Comparison:
    """A variant's values against the baseline's, both keyed by seed: the paired t-test over the seeds finite on both
    sides where there are two, else Welch's t-test over all finite values of each side."""
    v_all = {seed: float(value) for seed, value in variant.items() if math.isfinite(float(value))}
    b_all = {seed: float(value) for seed, value in baseline.items() if math.isfinite(float(value))}
    shared = sorted(set(v_all) & set(b_all), key=repr)
    if len(shared) >= 2:
        return _paired(np.array([v_all[s] for s in shared]), np.array([b_all[s] for s in shared]))
    return _welch(np.array(list(v_all.values()), dtype=np.float64), np.array(list(b_all.values()), dtype=np.float64))


def _paired(v: np.ndarray, b: np.ndarray, with_seeds_needed: bool = True) -> Comparison:
    differences = v - b
    n = int(differences.size)
    delta = float(np.mean(differences))
    sd = float(np.std(differences, ddof=1))
    if _is_zero_spread(sd, v, b):
        return Comparison(delta, None, PAIRED, n, 0.0, None, None,
                          "zero variance: every paired difference is the same")
    with _exact_zero_spread_ok():
        test = stats.ttest_rel(v, b)
        low, high = test.confidence_interval(0.95)
    return Comparison(delta, float(test.pvalue), PAIRED, n, sd, minimum_detectable_effect(sd, n, paired=True),
                      seeds_needed(delta, sd, paired=True) if with_seeds_needed else None,
                      interval=(float(low), float(high)))


def _welch(v: np.ndarray, b: np.ndarray, with_seeds_needed: bool = True) -> Comparison:
    n = int(min(v.size, b.size))
    if n == 0:
        missing = " and ".join(name for name, side in (("variant", v), ("baseline", b)) if side.size == 0)
        return Comparison(math.nan, None, WELCH, 0, None, None, None, f"no finite values in {missing}")
    delta = float(np.mean(v) - np.mean(b))
    if n == 1:
        if v.size == 1 and b.size == 1:
            reason = "one seed: no spread"
        else:
            reason = f"one seed in {'variant' if v.size == 1 else 'baseline'}: no spread"
        return Comparison(delta, None, WELCH, 1, None, None, None, reason)
    s_v, s_b = float(np.std(v, ddof=1)), float(np.std(b, ddof=1))
    sd = math.sqrt((s_v**2 + s_b**2) / 2.0)
    if _is_zero_spread(sd, v, b):
        return Comparison(delta, None, WELCH, n, 0.0, None, None,
                          "zero variance: every run of both variant and baseline has the same value")
    with _exact_zero_spread_ok():
        p_value = float(stats.ttest_ind(v, b, equal_var=False).pvalue)
    return Comparison(delta, p_value, WELCH, n, sd, minimum_detectable_effect(sd, n, paired=False),
                      seeds_needed(delta, sd, paired=False) if with_seeds_needed else None)


def rank_agreement(ours: Mapping[str, float], paper: Mapping[str, float]) -> dict[str, Any]:
    """Do our variants rank like the paper's? Kendall's tau-b over the keys both have with finite values: absolute
    perplexities cannot match the paper's far larger models, but the order can. None with a `reason` for n < 3 or
    one side all tied."""
    keys = sorted(k for k in set(ours) & set(paper) if math.isfinite(float(ours[k])) and math.isfinite(float(paper[k])))
    result: dict[str, Any] = {"tau": None, "p_value": None, "n": len(keys), "keys": keys, "reason": None}
    if len(keys) < 3:
        result["reason"] = f"{len(keys)} variant(s) in both ours and the paper's; need at least 3"
        return result
    x, y = [float(ours[k]) for k in keys], [float(paper[k]) for k in keys]
    if len(set(x)) == 1 or len(set(y)) == 1:
        result["reason"] = f"all {'our' if len(set(x)) == 1 else 'paper'} values are tied: no order to compare"
        return result
    tau = stats.kendalltau(x, y)
    result["tau"], result["p_value"] = float(tau.statistic), float(tau.pvalue)
    return result


def sign_agreement(our_deltas: Mapping[str, float], paper_deltas: Mapping[str, float]) -> dict[str, Any]:
    """Do our variants move against baseline in the paper's direction? The fraction of shared keys (not baseline,
    delta nonzero and finite on both sides) whose deltas have the same sign."""
    def usable(value: float) -> bool:
        return math.isfinite(float(value)) and float(value) != 0.0

    keys = sorted(k for k in set(our_deltas) & set(paper_deltas)
                  if k != "baseline" and usable(our_deltas[k]) and usable(paper_deltas[k]))
    disagree = [k for k in keys if (float(our_deltas[k]) > 0.0) != (float(paper_deltas[k]) > 0.0)]
    n = len(keys)
    return {"fraction": (n - len(disagree)) / n if n else None, "n": n, "agree": n - len(disagree),
            "disagree": disagree,
            "reason": None if n else "no variant has a nonzero, finite delta in both ours and the paper's"}


# --- the claims table: the design's pairing, equivalence, multiplicity, LR sensitivity, rank intervals --------


def shared_seeds(*groups: Mapping[int, float]) -> list[int]:
    """The seeds at which every group has a finite value, sorted."""
    common = set.intersection(*(set(seed for seed, value in group.items() if math.isfinite(float(value)))
                                for group in groups)) if groups else set()
    return sorted(common, key=repr)


def seed_correlation(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson's r of two groups' values at the same seeds; None where it is 0/0 or there are fewer than two."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 2 or _is_zero_spread(float(np.std(a)), a) or _is_zero_spread(float(np.std(b)), b):
        return None
    return float(np.corrcoef(a, b)[0, 1])


def compare_shared_seeds(a: Mapping[int, float], b: Mapping[int, float]) -> Comparison:
    """Group a against group b over the seeds both have finite values for: the paired t-test, always.

    The design pairs runs by seed, so the paired test is the test whatever the values (choosing it only where r > 0
    has a type-I error of 6.5% at rho 0 with 3 seeds, 8-16% at rho < 0). `correlation` is r, a description only.
    `seeds_needed` is left None: the claims table does not show it, and its search costs a tenth of a second a row.
    """
    seeds = shared_seeds(a, b)
    v = np.array([float(a[s]) for s in seeds], dtype=np.float64)
    w = np.array([float(b[s]) for s in seeds], dtype=np.float64)
    if len(seeds) < 2:
        delta = float(v[0] - w[0]) if seeds else math.nan
        return Comparison(delta, None, PAIRED, len(seeds), None, None, None,
                          f"{len(seeds)} shared seed(s): need two to test")
    result = _paired(v, w, with_seeds_needed=False)
    return dataclasses.replace(result, correlation=seed_correlation(v, w))


@dataclass(frozen=True)
class Ratio:
    """mean(variant) / mean(baseline) over the seeds both have (finite and above 0), with a 95% interval: the
    one-sample t-interval of the per-seed log ratios, exponentiated. Logs, because a cost is a multiple (1.2x and
    1/1.2x lie the same distance from 1); a t-interval, because a percentile bootstrap over 3 or 4 seeds has a
    handful of distinct resamples and is too narrow. `reason` says why `interval` is None."""

    ratio: float
    n: int
    interval: tuple[float, float] | None
    reason: str | None = None


def ratio_of_means(variant: Mapping[int, float], baseline: Mapping[int, float], level: float = 0.95) -> Ratio:
    """The variant's values over the baseline's, both keyed by seed, paired by seed (`Ratio`)."""
    positive = [{seed: float(v) for seed, v in side.items() if math.isfinite(float(v)) and float(v) > 0}
                for side in (variant, baseline)]
    seeds = shared_seeds(*positive)
    v = np.array([positive[0][s] for s in seeds], dtype=np.float64)
    b = np.array([positive[1][s] for s in seeds], dtype=np.float64)
    if not seeds:
        return Ratio(math.nan, 0, None, "no shared seeds")
    ratio = float(np.mean(v) / np.mean(b))
    if len(seeds) < 2:
        return Ratio(ratio, 1, None, "1 shared seed: no interval")
    log_ratios = np.log(v / b)
    if _is_zero_spread(float(np.std(log_ratios, ddof=1)), log_ratios):
        return Ratio(ratio, len(seeds), None, "every seed's ratio is the same: no spread")
    low, high = stats.ttest_1samp(log_ratios, 0.0).confidence_interval(level)
    return Ratio(ratio, len(seeds), (math.exp(low), math.exp(high)))


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests (TOST, Schuirmann 1987) of |mean(a) - mean(b)| < margin.

    p_value: the larger of the two one-sided p-values (H0: delta <= -margin; H0: delta >= +margin); below alpha the
        difference is inside +-margin at level alpha, which is the 90% interval lying inside it for alpha 0.05.
    interval: the two-sided 95% interval of delta from the same test, to say "outside the margin" when it lies beyond.
    """

    delta: float
    margin: float
    p_value: float | None
    test: TestName
    n: int
    interval: tuple[float, float] | None
    reason: str | None = None


def tost(a: Sequence[float], b: Sequence[float], margin: float, paired: bool) -> Equivalence:
    """TOST for the difference of means a - b within +-`margin`; paired (a[i] with b[i]) or Welch, as statsmodels'
    `ttost_paired` and `ttost_ind(..., usevar="unequal")`."""
    v, w = _finite(a), _finite(b)
    test: TestName = PAIRED if paired else WELCH
    if paired and v.size != w.size:
        raise ValueError(f"paired TOST needs as many values in a as in b, got {v.size} and {w.size}")
    n = int(min(v.size, w.size))
    delta = float(np.mean(v) - np.mean(w)) if v.size and w.size else math.nan
    if n < 2:
        return Equivalence(delta, margin, None, test, n, None, "fewer than two values a side: no spread")
    if not (math.isfinite(margin) and margin > 0.0):
        return Equivalence(delta, margin, None, test, n, None, f"margin {margin:g} is not > 0")
    if paired:
        differences = v - w
        if _is_zero_spread(float(np.std(differences, ddof=1)), v, w):
            return Equivalence(delta, margin, None, test, n, None, "zero variance: every paired difference is the same")
        with _exact_zero_spread_ok():
            above = stats.ttest_1samp(differences, -margin, alternative="greater").pvalue
            below = stats.ttest_1samp(differences, margin, alternative="less").pvalue
            low, high = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    else:
        if _is_zero_spread(math.sqrt((np.var(v, ddof=1) + np.var(w, ddof=1)) / 2.0), v, w):
            return Equivalence(delta, margin, None, test, n, None,
                               "zero variance: every run of both groups is the same")
        with _exact_zero_spread_ok():
            above = stats.ttest_ind(v + margin, w, equal_var=False, alternative="greater").pvalue
            below = stats.ttest_ind(v - margin, w, equal_var=False, alternative="less").pvalue
            low, high = stats.ttest_ind(v, w, equal_var=False).confidence_interval(0.95)
    return Equivalence(delta, margin, float(max(above, below)), test, n, (float(low), float(high)))


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini-Hochberg q-values (adjusted p-values, `scipy.stats.false_discovery_control(method="bh")`) of the
    p-values given; a None (an untested row) stays None and is not counted in the family."""
    tested = [i for i, p in enumerate(p_values) if p is not None and math.isfinite(float(p))]
    q_values: list[float | None] = [None] * len(p_values)
    if tested:
        adjusted = stats.false_discovery_control(np.array([float(p_values[i]) for i in tested]), method="bh")
        for i, q in zip(tested, adjusted, strict=True):
            q_values[i] = float(q)
    return q_values


def lr_sensitivity(final_loss_by_lr: Mapping[float, float], init_loss: float) -> float:
    """Learning-rate sensitivity (Wortsman et al. 2023, arXiv 2309.14322, section 3.1): over a grid of rates, the mean
    of how far each rate's final loss sits above the best one, each loss capped at the loss at initialisation:

        mean_lr min(L(lr), L_init) - min_lr min(L(lr), L_init)

    A diverged run (NaN or inf loss) counts as `init_loss`: it learned nothing that survived. 0 means every rate ends
    at the best loss; the cap keeps one blown-up rate from dominating the mean. NaN for an empty grid.
    """
    capped = [min(float(loss), init_loss) if math.isfinite(float(loss)) else init_loss
              for loss in final_loss_by_lr.values()]
    if not capped:
        return math.nan
    return float(np.mean(capped) - min(capped))


def kendall_tau_b(ours: np.ndarray, paper: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each row of `ours` (R x K) against `paper` (K), NaN entries of a row left out of that row;
    NaN where fewer than 3 entries are left or one side is all tied. The same figure as `scipy.stats.kendalltau`
    (tau-b), vectorised over rows for the bootstrap: (concordant - discordant) pairs over
    sqrt(pairs untied in ours x pairs untied in the paper), counted over the pairs both entries of which are present.
    """
    ours = np.atleast_2d(np.asarray(ours, dtype=np.float64))
    paper = np.asarray(paper, dtype=np.float64)
    present = np.isfinite(ours)
    upper = np.triu(np.ones((paper.size, paper.size), dtype=bool), k=1)
    pairs = present[:, :, None] & present[:, None, :] & upper
    sign_ours = np.sign(np.nan_to_num(ours[:, :, None] - ours[:, None, :])) * pairs
    sign_paper = np.sign(paper[:, None] - paper[None, :]) * pairs
    numerator = np.sum(sign_ours * sign_paper, axis=(1, 2))
    denominator = np.sqrt(np.sum(sign_ours**2, axis=(1, 2)) * np.sum(sign_paper**2, axis=(1, 2)))
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = numerator / denominator
    tau[(present.sum(axis=1) < 3) | (denominator == 0)] = np.nan
    return tau


def rank_agreement_interval(values: Mapping[str, Mapping[int, float]], paper: Mapping[str, float],
                            resamples: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """A percentile bootstrap interval of Kendall's tau between our group means ({variant: {seed: value}}) and the
    paper's, resampling seeds with replacement; resamples without a tau are skipped, None when none has one."""
    keys = [k for k in values if k in paper and math.isfinite(float(paper[k]))]
    seeds = sorted({s for k in keys for s in values[k]}, key=repr)
    if len(keys) < 3 or not seeds:
        return None
    table = np.array([[float(values[k].get(s, math.nan)) for s in seeds] for k in keys], dtype=np.float64)
    table[~np.isfinite(table)] = np.nan
    drawn = np.random.default_rng(seed).integers(0, len(seeds), size=(resamples, len(seeds)))
    samples = table[:, drawn]  # K x R x S
    counts = np.sum(np.isfinite(samples), axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (np.nansum(samples, axis=2) / counts).T  # R x K; NaN where a variant drew none of its seeds
    taus = kendall_tau_b(means, np.array([float(paper[k]) for k in keys]))
    taus = taus[np.isfinite(taus)]
    if taus.size == 0:
        return None
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(taus, [tail, 1.0 - tail])
    return float(low), float(high)
