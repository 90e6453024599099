"""What a variant is worth in compute, read off a ladder of model sizes ("rungs") as in marin's ablation protocol: each
arm's final losses over the rungs against a scaling law L(C) = L_inf + A * C**-alpha, C a rung's compute in FLOPs or in
tokens (one unit for every rung of both arms, never mixed). The baseline arm sets L_inf and alpha; each arm gets its
own A. The variant's compute multiplier m solves L_baseline(m * C) = L_variant(C):

    A_b * (m C)**-alpha = A_v * C**-alpha   =>   m = (A_b / A_v) ** (1 / alpha)

With L_inf and alpha shared, m is the same at every C; it is reported at the largest rung, as issue 44 words it. Above 1
the variant reaches the baseline's loss with 1/m of the compute.

Which parameters the baseline's rungs identify (the rule): the baseline fits one parameter fewer than it has rungs, so
at least one rung is left to contradict the law.
- 4 rungs or more: L_inf, alpha and A_b, by least squares of loss on log compute;
- 3 rungs: alpha fixed to Chinchilla's (CHINCHILLA_ALPHA), L_inf and A_b fitted. L_inf is never taken from the
  literature: Chinchilla's E = 1.69 nats is for its own tokenizer and data, not ours;
- fewer: not testable. The variant arm needs 3 rungs too, so that its own rungs show whether it follows the
  baseline's curve.
Each variant's A_v is then fitted with L_inf and alpha fixed (linear least squares, closed form).

The interval is a seed bootstrap (scipy.stats.bootstrap, percentile): seeds are resampled within each arm and rung, and
the whole fit is redone on each resample, from a fixed numpy Generator seed so a report is the same each time it is
made. Arms are resampled independently, ignoring that seeds share data order across arms: the interval errs wide.
With 2 or 3 seeds a rung a percentile bootstrap has few distinct resamples and errs narrow (measured on the tests'
ladder of 4 rungs and 3 seeds: 18 of 20 noise draws' intervals held the true multiplier). With alpha fixed (3 rungs) the
interval holds the seeds' noise only, not the doubt about alpha. A multiplier far from 1 reads the baseline's law
beyond its rungs: an extrapolation.

Pure numbers in, numbers out (numpy, scipy); `gatelab.report.plots.plot_ladder` draws a ladder and its fits.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from gatelab.errors import GatelabError

# One arm's ladder: each rung's compute and its seeds' final losses (a diverged seed's NaN is dropped, not fitted).
Rungs = Mapping[float, Sequence[float]]

# Chinchilla (Hoffmann et al. 2022, arXiv:2203.15556, §3.3 "Approach 3") fits L(N, D) = E + A/N**0.34 + B/D**0.28. Along
# its compute-optimal frontier (N ∝ C**(β/(α+β)), D ∝ C**(α/(α+β))) both terms fall as C**-(αβ/(α+β)) = C**-0.154: the
# exponent of loss in compute for a ladder that grows parameters and tokens together near the compute-optimal ratio.
CHINCHILLA_ALPHA = 0.34 * 0.28 / (0.34 + 0.28)
CHINCHILLA_SOURCE = "Chinchilla's 0.154 (Hoffmann et al. 2022, §3.3: αβ/(α+β) for α = 0.34, β = 0.28)"
RUNGS_TO_FIT_ALPHA = 4  # L_inf, alpha, A and a rung to spare
MIN_RUNGS = 3  # L_inf, A and a rung to spare
MIN_SEEDS_PER_RUNG = 2  # a seed bootstrap of one seed has no spread to resample
# Loss-in-compute exponents of language models run 0.05 (Kaplan et al. 2020's L(C_min)) to about 0.35; a fit at either
# bound has not found the law's curvature, and 2 keeps C**-alpha finite in float64 over any ladder.
ALPHA_BOUNDS = (0.0, 2.0)
RESAMPLES = 1000
BOOTSTRAP_SEED = 0
# A spread of mean losses this small relative to their size is rounding residue, not a slope: the ladder is flat.
_ZERO_SPREAD = 1e-12


@dataclass(frozen=True)
class LadderFit:
    """A variant's compute multiplier against the baseline from both arms' ladders, or why it is not testable.

    multiplier: m with L_baseline(m C) = L_variant(C), at the largest rung (the same at every C: module docstring); the
        point estimate where both arms' laws were fitted, NaN where not.
    interval: its seed-bootstrap 95% interval; None where not testable.
    n_rungs: the baseline's rungs; largest_compute: the variant's largest rung, where m is read.
    alpha, irreducible_loss (L_inf): the law's, from the baseline's rungs (alpha_source says whether alpha was fitted).
    baseline_scale, variant_scale: each arm's A, in loss x compute**alpha (`scaling_law` evaluates either arm's law).
    why_not: why the multiplier is not testable; None where it is.
    """

    multiplier: float
    interval: tuple[float, float] | None
    n_rungs: int
    largest_compute: float
    alpha: float
    alpha_source: str
    irreducible_loss: float
    baseline_scale: float
    variant_scale: float
    why_not: str | None = None

    @property
    def testable(self) -> bool:
        return self.why_not is None


@dataclass(frozen=True)
class _Law:
    """The baseline's law as fitted: excess = L(reference) - L_inf stands in for A (A = excess * reference**alpha),
    which keeps the fitted numbers near 1 whatever the unit of compute."""

    irreducible_loss: float
    excess: float
    alpha: float


def scaling_law(compute, irreducible_loss: float, scale: float, alpha: float) -> np.ndarray:
    """L(C) = L_inf + A * C**-alpha at each compute."""
    return irreducible_loss + scale * np.exp(-alpha * np.log(np.asarray(compute, dtype=float)))


def _clean(points: Rungs, arm: str) -> dict[float, np.ndarray]:
    """The arm's rungs in order of compute, each with its finite losses; a rung with none is left out."""
    rungs = {}
    for compute, losses in sorted(points.items()):
        if not (math.isfinite(float(compute)) and float(compute) > 0):
            raise GatelabError(f"ladder of the {arm} arm: a rung's compute is {compute!r}; give each rung's compute "
                               "as a positive number of FLOPs (or tokens)")
        values = np.asarray([float(v) for v in losses], dtype=float)
        values = values[np.isfinite(values)]
        if np.any(values <= 0):
            raise GatelabError(f"ladder of the {arm} arm: a loss at compute {compute:g} is {values.min():g}; give each "
                               "seed's final cross-entropy, which is above 0")
        if values.size:
            rungs[float(compute)] = values
    return rungs


def _flatten(rungs: Mapping[float, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every seed's (compute, loss), as two arrays."""
    compute = np.concatenate([np.full(len(losses), c) for c, losses in rungs.items()])
    return compute, np.concatenate(list(rungs.values()))


def _why_not_falling(rungs: Mapping[float, np.ndarray], unit: str) -> str | None:
    """None where the baseline's mean loss falls from every rung to the next; else how it does not."""
    means = np.array([losses.mean() for losses in rungs.values()])
    steps = np.diff(means)
    if np.all(steps < 0):
        return None
    if np.ptp(means) <= _ZERO_SPREAD * np.abs(means).max():
        how = "is flat over compute"
    elif np.all(steps >= 0):
        how = "rises with compute"
    else:
        how = "does not fall from every rung to the next"
    listed = ", ".join(f"{mean:.4g} at {compute:.3g}" for compute, mean in zip(rungs, means))
    return f"the baseline's mean loss {how} ({listed} {unit}): a scaling law needs it to fall as compute grows"


def _fit_baseline(rungs: Mapping[float, np.ndarray], alpha: float | None) -> tuple[_Law | None, str | None]:
    """The baseline's law by least squares of loss on log compute, L_inf in [0, the smallest loss] and alpha in
    ALPHA_BOUNDS (or fixed to `alpha`), or why no law was found."""
    compute, loss = _flatten(rungs)
    log_compute = np.log(compute / compute.max())
    fit_alpha = alpha is None

    def residuals(params: np.ndarray) -> np.ndarray:
        floor, log_excess, exponent = params if fit_alpha else (*params, alpha)
        return floor + np.exp(log_excess - exponent * log_compute) - loss

    lowest = float(loss.min())
    start, lower, upper = [lowest / 2, math.log(lowest / 2)], [0.0, -np.inf], [lowest, np.inf]
    if fit_alpha:
        start, lower, upper = start + [CHINCHILLA_ALPHA], lower + [ALPHA_BOUNDS[0]], upper + [ALPHA_BOUNDS[1]]
    result = optimize.least_squares(residuals, start, bounds=(lower, upper), x_scale="jac")
    if not result.success:
        # measured: a ladder that falls in a straight line in log compute is a valley along which every L_inf fits
        return None, (f"the fit of the baseline's law did not converge in {result.nfev} evaluations: its rungs do "
                      "not pin L_inf and alpha (a loss falling in a straight line in log compute fits any L_inf "
                      "alike); add rungs or spread them over more compute")
    floor, log_excess, exponent = result.x if fit_alpha else (*result.x, alpha)
    if fit_alpha and result.active_mask[2] != 0:
        return None, (f"the baseline's alpha ran to its bound ({exponent:.3g}): its rungs do not pin the law's "
                      "curvature; add rungs or spread them over more compute")
    if result.active_mask[0] == 1:
        return None, (f"the baseline's L_inf ran up to its smallest loss ({floor:.4g}): its rungs do not pin the "
                      "law's floor; add rungs or spread them over more compute")
    return _Law(float(floor), math.exp(log_excess), float(exponent)), None


def _variant_excess(rungs: Mapping[float, np.ndarray], reference: float, law: _Law) -> float:
    """The variant's L - L_inf at the baseline's `reference` compute with L_inf and alpha the baseline's: the
    least-squares solution of a model linear in it."""
    compute, loss = _flatten(rungs)
    shape = np.exp(-law.alpha * np.log(compute / reference))
    return float(shape @ (loss - law.irreducible_loss) / (shape @ shape))


def _fit_both(baseline: Mapping[float, np.ndarray], variant: Mapping[float, np.ndarray],
              alpha: float | None) -> tuple[_Law | None, float, float, str | None]:
    """(the baseline's law, the variant's excess at the baseline's largest rung, the multiplier, None), or why not."""
    law, why_not = _fit_baseline(baseline, alpha)
    if law is None:
        return None, math.nan, math.nan, why_not
    excess = _variant_excess(variant, max(baseline), law)
    if excess <= 0:
        return law, excess, math.nan, (f"the variant's losses lie at or below the baseline's L_inf "
                                       f"({law.irreducible_loss:.4g}): its A is not positive")
    return law, excess, (law.excess / excess) ** (1 / law.alpha), None


def _bootstrap_interval(baseline: Mapping[float, np.ndarray], variant: Mapping[float, np.ndarray],
                        alpha: float | None, resamples: int,
                        seed: int) -> tuple[tuple[float, float] | None, str | None]:
    """The multiplier's seed-bootstrap 95% interval (module docstring), or why it is not finite."""
    split = len(baseline)

    def multiplier(*samples: np.ndarray) -> float:
        return _fit_both(dict(zip(baseline, samples[:split])), dict(zip(variant, samples[split:])), alpha)[2]

    with warnings.catch_warnings():  # a resample without a multiplier is counted and said below, not warned of
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap([*baseline.values(), *variant.values()], multiplier, n_resamples=resamples,
                                 vectorized=False, method="percentile", rng=np.random.default_rng(seed))
    low, high = (float(bound) for bound in result.confidence_interval)
    if not (math.isfinite(low) and math.isfinite(high)):
        failed = int(np.sum(~np.isfinite(result.bootstrap_distribution)))
        return None, (f"the bootstrap's 95% interval is not finite ({failed} of {resamples} resamples of the seeds "
                      "gave no finite multiplier): the ladder does not pin the law")
    return (low, high), None


def _why_too_few(baseline: Mapping[float, np.ndarray], variant: Mapping[float, np.ndarray]) -> str | None:
    """Why the arms' rungs cannot identify a law, or None."""
    for arm, rungs in (("baseline", baseline), ("variant", variant)):
        if len(rungs) < MIN_RUNGS:
            return (f"the {arm} arm has {len(rungs)} rung{'s' * (len(rungs) != 1)} with a finite loss: a ladder "
                    f"needs {MIN_RUNGS} in each arm (alpha then fixed to Chinchilla's), {RUNGS_TO_FIT_ALPHA} in the "
                    "baseline's to fit alpha")
    return None


def _why_no_bootstrap(baseline: Mapping[float, np.ndarray], variant: Mapping[float, np.ndarray],
                      unit: str) -> str | None:
    """Why a rung has too few seeds to resample, or None."""
    for arm, rungs in (("baseline", baseline), ("variant", variant)):
        few = [compute for compute, losses in rungs.items() if losses.size < MIN_SEEDS_PER_RUNG]
        if few:
            listed = ", ".join(f"{compute:.3g}" for compute in few)
            return (f"the {arm} arm has fewer than {MIN_SEEDS_PER_RUNG} seeds with a finite loss at {listed} {unit}: "
                    "a seed bootstrap needs 2 a rung")
    return None


def fit_ladder(baseline_points: Rungs, variant_points: Rungs, unit: str = "FLOPs", resamples: int = RESAMPLES,
               seed: int = BOOTSTRAP_SEED) -> LadderFit:
    """The variant's compute multiplier against the baseline, each arm's ladder given as {compute: [each seed's final
    loss]} in one `unit` (FLOPs or tokens), with its seed-bootstrap interval (`resamples` resamples from `seed`), or
    why it is not testable (`LadderFit`; the rule in the module docstring)."""
    baseline, variant = _clean(baseline_points, "baseline"), _clean(variant_points, "variant")
    alpha = None if len(baseline) >= RUNGS_TO_FIT_ALPHA else CHINCHILLA_ALPHA
    source = f"fitted on the baseline's {len(baseline)} rungs" if alpha is None else CHINCHILLA_SOURCE
    law, variant_excess, multiplier, interval = None, math.nan, math.nan, None
    why_not = _why_too_few(baseline, variant) or _why_not_falling(baseline, unit)
    if why_not is None:
        law, variant_excess, multiplier, why_not = _fit_both(baseline, variant, alpha)
        why_not = why_not or _why_no_bootstrap(baseline, variant, unit)
    if why_not is None:
        interval, why_not = _bootstrap_interval(baseline, variant, alpha, resamples, seed)
    return _result(multiplier, interval, baseline, variant, source, law, variant_excess, why_not)


def _result(multiplier: float, interval: tuple[float, float] | None, baseline: Mapping[float, np.ndarray],
            variant: Mapping[float, np.ndarray], source: str, law: _Law | None, variant_excess: float,
            why_not: str | None) -> LadderFit:
    """A LadderFit, each arm's A from its excess over L_inf at the baseline's largest rung."""
    largest = max(variant, default=math.nan)
    if law is None:
        return LadderFit(multiplier, None, len(baseline), largest, math.nan, source, math.nan, math.nan, math.nan,
                         why_not)
    to_scale = max(baseline) ** law.alpha
    return LadderFit(multiplier, interval, len(baseline), largest, law.alpha, source, law.irreducible_loss,
                     law.excess * to_scale, variant_excess * to_scale, why_not)


@dataclass(frozen=True)
class WallClockMultiplier:
    """A variant's worth in wall-clock time against the baseline, with a 95% interval where both factors have one."""

    multiplier: float
    interval: tuple[float, float] | None


def wall_clock_multiplier(compute_multiplier: float, tokens_per_s_ratio: float,
                          compute_interval: tuple[float, float] | None = None,
                          ratio_interval: tuple[float, float] | None = None) -> WallClockMultiplier:
    """The compute multiplier times the variant's tokens a second over the baseline's (at equal tokens a step, 1 over
    the step-time ratio, its interval's bounds swapped and inverted): a slower variant is worth less in time than in
    compute (marin: an MLP gate with lower loss scored 0.924 once its slower step counted).

    The interval, where both factors have one, adds each side's log half-widths in quadrature: a delta-method
    approximation that holds where the two errors are independent (seeds' losses, seeds' step times) and near
    log-normal."""
    multiplier = compute_multiplier * tokens_per_s_ratio
    if compute_interval is None or ratio_interval is None:
        return WallClockMultiplier(multiplier, None)
    below = math.hypot(math.log(compute_multiplier / compute_interval[0]),
                       math.log(tokens_per_s_ratio / ratio_interval[0]))
    above = math.hypot(math.log(compute_interval[1] / compute_multiplier),
                       math.log(ratio_interval[1] / tokens_per_s_ratio))
    return WallClockMultiplier(multiplier, (multiplier * math.exp(-below), multiplier * math.exp(above)))
