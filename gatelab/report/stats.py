"""Significance and agreement statistics for the report tables: is a variant's difference from baseline real, how small
a difference could these seeds have seen, and do our results rank and move like the paper's?

Runs of different variants with the same seed share data order and initialisation ("common random numbers"), so a
variant and the baseline are compared *paired by seed* whenever they share at least two seeds: the seed-to-seed noise
they have in common cancels in the per-seed differences, which makes the paired t-test far more sensitive than a
two-sample test on the same runs. Only without two shared seeds does `compare` fall back to Welch's t-test.

A run that diverged has no perplexity: its value arrives as NaN (or an overflowed inf) and is dropped, never averaged;
every function here counts only the finite values it used.

The claims table (gatelab.report.claims) is stricter, because a verdict rests on each row: `compare_shared_seeds`
uses only the seeds both groups have and always pairs them, since the design pairs runs by seed (a test chosen after
looking at the data, e.g. "paired only where the seeds correlate", has a type-I error above its level); "close" claims
are equivalence tests (`tost`); the table's p-values are corrected together (`benjamini_hochberg`); `lr_sensitivity`
and `rank_agreement_interval` give the learning-rate and rank rows.

All statistics come from `scipy.stats`; this module only chooses the test, handles the degenerate cases (one seed,
zero spread) with a stated reason instead of a NaN, and turns a test's power into "minimum detectable effect" and
"seeds needed", which say whether a null result means "no effect" or merely "too few seeds".
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
    """A variant against baseline over seeds.

    delta: mean of (variant - baseline): over the shared seeds' paired differences for the paired test, the difference
        of the two groups' means for Welch. NaN only when one side has no finite value at all (see `reason`).
    p_value: two-sided p-value of the test; None when it cannot be computed, with `reason` saying why.
    test: "paired t" (at least two shared seeds) or "Welch t" (otherwise, over all finite values).
    n: the number of pairs for the paired test; for Welch the *smaller* group's size. The smaller size is what
        `mde` and `seeds_needed` are computed with (two equal groups of that size), so they err on the side of
        "undetectable" rather than overstate what an unbalanced design could see.
    sd: standard deviation (ddof=1) of the paired differences; for Welch the root mean square of the two groups'
        standard deviations, sqrt((s_v^2 + s_b^2) / 2), the sd for which two groups of n give Welch's standard error
        sqrt(s_v^2/n + s_b^2/n) = sd * sqrt(2/n). None when it cannot be estimated (a group of one).
    mde: smallest |delta| this test would detect at two-sided alpha 0.05 with power 0.8, given `n` and `sd`
        (see `minimum_detectable_effect`); None when not computable (n < 2, sd unknown or zero).
    seeds_needed: how many seeds (pairs for paired, per group for Welch) would detect the observed |delta| at
        alpha 0.05 with power 0.8 (see `seeds_needed`); None when delta is 0 or NaN, sd is unknown or zero, or more
        than 10,000 seeds would be needed.
    reason: why `p_value` is None; None when it was computed.
    correlation: from `compare_shared_seeds`, the correlation of the two groups over the seeds they share, a
        description only (it does not choose the test); None from `compare`, or where it is undefined (fewer than two
        seeds, a side without spread).
    interval: the two-sided 95% confidence interval of `delta` from the paired test (t over the n - 1 df of the
        differences); None for Welch and wherever p_value is None.
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
    """Silence SciPy's "Precision loss ... catastrophic cancellation" warning around a t-test.

    SciPy warns whenever one sample's values are (nearly) identical, e.g. a baseline whose seeds all reached the same
    perplexity in a Welch test. That is legitimate there (Welch only needs the *combined* spread to be nonzero), and
    the degenerate case the warning is about, an all-zero spread, is caught before any test runs, with a reason.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        yield


def mean_std(values: Iterable[float]) -> tuple[float, float | None, int]:
    """(mean, std with ddof=1, n) of the finite values, NaN/inf dropped.

    The std is the sample standard deviation (ddof=1): the seeds are a sample of the runs one could have made, and
    the ddof=0 version would understate the spread of a handful of seeds. It is None for n = 1 (one value has no
    spread), and the mean is NaN for n = 0, so a caller can tell "no runs finished" from "one run".
    """
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

    Paired (`paired=True`, n pairs): the one-sample t-test on the n differences, standard error sd/sqrt(n), df = n-1.
    Under a true mean difference `effect` the t statistic follows a noncentral t with df n-1 and noncentrality
    lambda = effect / (sd / sqrt(n)).
    Welch (`paired=False`, two groups of n each, both with sd `sd`): standard error sd*sqrt(2/n); with equal sds and
    sizes the Welch-Satterthwaite df is exactly 2n-2, and lambda = effect / (sd * sqrt(2/n)).
    In both cases power(lambda) = P(T' > t_crit) + P(T' < -t_crit), t_crit = t.ppf(1 - alpha/2, df),
    T' ~ nct(df, lambda). Power rises monotonically from alpha at lambda = 0, so `brentq` finds the unique lambda
    with power(lambda) = `power`, and the effect is lambda times the standard error.

    For large n this approaches the normal-theory (z_{1-alpha/2} + z_power) * SE, i.e. 2.80 * SE at the defaults;
    at small n the t-distribution's heavier tails make it noticeably larger, which is the point of computing it.
    None when n < 2 (no degrees of freedom) or `sd` is unknown, not finite or zero (a zero spread among a few seeds
    is a degenerate estimate, not evidence that no noise exists).
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
    """The smallest n >= 2 (pairs if `paired`, else per group) whose minimum detectable effect is <= |delta|.

    That is how many seeds a true difference of the observed size would need to reach p < `alpha` with probability
    `power`. The MDE falls monotonically with n, so this is a bisection over [2, max_n]. None when delta is 0 or not
    finite (nothing to detect), `sd` is unknown, not finite or zero, or even `max_n` seeds would not suffice.
    """
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
    """A variant's values against the baseline's, both keyed by seed; NaN/inf values (diverged runs) are dropped.

    With at least two seeds finite on both sides, the paired t-test (`scipy.stats.ttest_rel`) over those shared seeds:
    runs with the same seed share data order and initialisation, so pairing cancels their common noise. Seeds only one
    side has are then left out, since they have no partner. With fewer shared seeds, Welch's t-test
    (`scipy.stats.ttest_ind(equal_var=False)`) over all finite values of each side: it does not assume the two
    variants are equally noisy. Degenerate cases return p_value None with a `reason`: one seed (no spread to test
    against), zero variance (every run or difference identical, so t is 0/0 or x/0), or a side with no values.
    """
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
    """Do our variants rank like the paper's? Kendall's tau (`scipy.stats.kendalltau`, tau-b) over the keys both have
    with finite values.

    Absolute perplexities cannot match (the paper trains far larger models far longer), but the order of the variants
    can; tau counts concordant minus discordant pairs, so one adjacent swap among 4 variants gives (5 - 1) / 6.
    Returns {"tau", "p_value", "n", "keys", "reason"}: tau and p_value are None with a `reason` when n < 3 (too few
    pairs for an order to mean anything) or when one side's values are all tied (no order to compare).
    """
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
    """Do our variants move against baseline in the paper's direction? The fraction of shared keys whose deltas have
    the same sign.

    Left out: "baseline" (its delta against itself is 0 by construction) and any key whose delta is 0 or not finite
    on either side (no direction to agree on). Returns {"fraction", "n", "agree", "disagree", "reason"}: `disagree`
    lists the keys that move the other way; fraction is None with a reason when no key is left.
    """
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
    """Pearson's r of two groups' values at the same seeds; None for fewer than two seeds or a side without spread
    (r is 0/0 there)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 2 or _is_zero_spread(float(np.std(a)), a) or _is_zero_spread(float(np.std(b)), b):
        return None
    return float(np.corrcoef(a, b)[0, 1])


def compare_shared_seeds(a: Mapping[int, float], b: Mapping[int, float]) -> Comparison:
    """Group a against group b over the seeds both have finite values for: the paired t-test, always.

    The sweeps cross every variant with the same seeds, and runs of one seed share data order and initialisation
    (common random numbers): the design pairs them, so the paired test is the test, whatever the seeds' values turn
    out to be. (Choosing it only where Pearson's r > 0, Welch's test otherwise, has a type-I error of 6.5% at rho 0
    with 3 seeds and 8-16% at rho < 0: issue 34.) Seeds only one group has are left out, so that `delta` is always the
    difference of the two means over one set of seeds; fewer than two shared seeds give no test, with a reason.
    `correlation` reports r as a description (None where it is undefined: fewer than two shared seeds, or a group
    whose values are all equal). `seeds_needed` is left None: the claims table does not show it, and its search costs
    a tenth of a second a row.
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
    """TOST for the difference of means a - b within +-`margin`; paired (a[i] with b[i]) or Welch.

    Paired: one-sample t-tests of the differences against -margin (alternative "greater") and +margin ("less"), df
    n - 1; statsmodels' `ttost_paired`. Welch: `ttest_ind(a + margin, b, equal_var=False, alternative="greater")` and
    `ttest_ind(a - margin, b, ..., alternative="less")`, Welch-Satterthwaite df; statsmodels' `ttost_ind(...,
    usevar="unequal")`. p_value is None with a reason for fewer than two values a side, a margin that is not > 0, or
    zero spread.
    """
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
    """A percentile bootstrap interval of Kendall's tau between our group means and the paper's, over seeds.

    `values` is {variant: {seed: value}}; variants the paper lacks are left out. Each resample draws as many seeds as
    there are (the union over variants) with replacement, takes each variant's mean over the drawn seeds it has finite
    values for (a seed drawn twice counts twice), and computes tau-b against `paper` (`kendall_tau_b`); resamples with
    no tau (fewer than 3 variants left, all tied) are skipped. A fixed `numpy.random.Generator` seed makes the interval
    the same on every call. None when no resample gives a tau.
    """
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
