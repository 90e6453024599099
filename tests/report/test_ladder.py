"""The compute multiplier from a ladder of model sizes (gatelab.report.ladder): synthetic ladders whose variant is the
baseline's law at 1.3x compute give 1.3 back with an interval around it; too few rungs or seeds, and flat or inverted
ladders, are not testable and say why; the wall-clock multiplier; the ladder's figure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gatelab.errors import GatelabError
from gatelab.report.ladder import CHINCHILLA_ALPHA, fit_ladder, scaling_law, wall_clock_multiplier
from gatelab.report.plots import plot_ladder
from tests.eval.test_plots import assert_drawn, assert_no_data

# The L_inf 2.0 and alpha 0.3, with A 8000 so the losses fall from 4.0 nats at 1e12 FLOPs to 2.7 at 3e13, as a
# small LM ladder's do (A 50 would put the whole ladder within 0.02 nats, under the seeds' noise).
LAW = {"irreducible_loss": 2.0, "scale": 8000.0, "alpha": 0.3}
RUNGS = (1e12, 3e12, 1e13, 3e13)
SEEDS = 3
NOISE = 0.005  # nats: the seed-to-seed spread of a small model's final loss


def ladder(rungs=RUNGS, compute_multiplier=1.0, law=LAW, noise=NOISE, seed=0) -> dict[float, list[float]]:
    """Each rung's seeds' losses: the law at `compute_multiplier` x the rung's compute, plus seeded noise."""
    rng = np.random.default_rng(seed)
    return {c: list(scaling_law(compute_multiplier * c, **law) + rng.normal(0.0, noise, SEEDS)) for c in rungs}


@pytest.mark.parametrize("noise_seed", [0, 1, 2])
def test_a_variant_on_the_baselines_law_at_1_3x_compute_is_worth_1_3x(noise_seed):
    fit = fit_ladder(ladder(seed=noise_seed), ladder(compute_multiplier=1.3, seed=100 + noise_seed))
    assert fit.testable, fit.why_not
    assert fit.multiplier == pytest.approx(1.3, rel=0.05)
    low, high = fit.interval
    assert low < 1.3 < high
    assert fit.n_rungs == 4 and fit.largest_compute == 3e13 and fit.alpha_source.startswith("fitted")
    assert fit.alpha == pytest.approx(0.3, abs=0.05) and fit.irreducible_loss == pytest.approx(2.0, abs=0.1)
    # m = (A_b / A_v) ** (1 / alpha) is the same at every compute, so each arm's law agrees at m C and C
    assert scaling_law(fit.multiplier * 1e12, fit.irreducible_loss, fit.baseline_scale, fit.alpha) == pytest.approx(
        scaling_law(1e12, fit.irreducible_loss, fit.variant_scale, fit.alpha))


def test_the_interval_is_the_same_every_time_and_a_variant_no_different_is_worth_1x():
    baseline, variant = ladder(seed=3), ladder(seed=4)
    fit = fit_ladder(baseline, variant, resamples=300)
    assert fit == fit_ladder(baseline, variant, resamples=300)  # a fixed Generator seed: the same report each time
    low, high = fit.interval
    assert low < 1.0 < high and fit.multiplier == pytest.approx(1.0, abs=0.05)


def test_three_rungs_fix_alpha_to_chinchillas_and_recover_a_ladder_that_follows_it():
    law = {**LAW, "scale": 200.0, "alpha": CHINCHILLA_ALPHA}  # 4.8 nats at 1e12 FLOPs to 3.1 at 1e13
    fit = fit_ladder(ladder(RUNGS[:3], law=law), ladder(RUNGS[:3], 1.3, law=law, seed=1))
    assert fit.testable, fit.why_not
    assert fit.n_rungs == 3 and fit.alpha == CHINCHILLA_ALPHA and fit.alpha_source.startswith("Chinchilla")
    assert fit.multiplier == pytest.approx(1.3, rel=0.05) and fit.interval[0] < 1.3 < fit.interval[1]


def test_three_rungs_of_a_steeper_ladder_than_chinchillas_still_read_a_multiplier_near_1_3():
    """With alpha fixed at 0.154 where the ladder's is 0.3, the fit moves L_inf down to follow the baseline's curve
    over the rungs; the variant, the same curve shifted along log compute, is followed too, so m comes out near 1.3
    (measured: 1.30 to 1.31 over three noise draws) while alpha and L_inf are wrong (L_inf 0.63 where the ladder's
    is 2.0). The multiplier is robust to the fixed alpha; L_inf is not."""
    fit = fit_ladder(ladder(RUNGS[:3]), ladder(RUNGS[:3], 1.3, seed=1))
    assert fit.testable, fit.why_not
    assert fit.alpha == CHINCHILLA_ALPHA and fit.irreducible_loss < 1.5
    assert fit.multiplier == pytest.approx(1.3, rel=0.1)


def test_two_rungs_are_not_testable():
    fit = fit_ladder(ladder(RUNGS[:2]), ladder(RUNGS[:2], 1.3))
    assert not fit.testable and math.isnan(fit.multiplier) and fit.interval is None
    assert "the baseline arm has 2 rungs with a finite loss" in fit.why_not and "needs 3" in fit.why_not


def test_a_variant_with_too_few_rungs_is_not_testable():
    fit = fit_ladder(ladder(), ladder(RUNGS[:1], 1.3))
    assert not fit.testable and "the variant arm has 1 rung " in fit.why_not


FLAT = {c: [2.99, 3.0, 3.01] for c in RUNGS}
INVERTED = {c: [6.0 - loss for loss in losses] for c, losses in ladder(noise=0.0).items()}  # 1.99 rising to 3.28
BUMPY = ladder(noise=0.0) | {3e12: [5.0, 5.0, 5.0]}


@pytest.mark.parametrize(("baseline", "how"), [(FLAT, "is flat over compute"), (INVERTED, "rises with compute"),
                                               (BUMPY, "does not fall from every rung to the next")])
def test_a_ladder_whose_loss_does_not_fall_is_not_testable_and_says_how(baseline, how):
    fit = fit_ladder(baseline, ladder(compute_multiplier=1.3))
    assert not fit.testable and fit.interval is None and math.isnan(fit.alpha)
    assert fit.why_not.startswith(f"the baseline's mean loss {how} (")
    assert fit.why_not.endswith("FLOPs): a scaling law needs it to fall as compute grows")


def test_an_inverted_ladder_names_its_means():
    fit = fit_ladder(INVERTED, ladder(compute_multiplier=1.3), unit="tokens")
    assert "(1.99 at 1e+12, 2.555 at 3e+12, 2.993 at 1e+13, 3.276 at 3e+13 tokens)" in fit.why_not


def test_a_ladder_falling_in_a_straight_line_in_log_compute_does_not_converge():
    straight = {c: [mean - 0.005, mean, mean + 0.005] for c, mean in zip(RUNGS, (3.02, 3.01, 3.0, 2.99))}
    fit = fit_ladder(straight, ladder(compute_multiplier=1.3))
    assert not fit.testable and fit.why_not.startswith("the fit of the baseline's law did not converge in ")
    assert "its rungs do not pin L_inf and alpha" in fit.why_not


def test_a_variant_at_the_baselines_floor_has_no_finite_interval():
    """At 1e8x the baseline's compute the variant's losses sit 0.004 nats above L_inf: some resamples of the seeds
    fit an L_inf above them, and give no multiplier."""
    fit = fit_ladder(ladder(), ladder(compute_multiplier=1e8, seed=1), resamples=200)
    assert not fit.testable and fit.interval is None and fit.multiplier > 1e5
    assert fit.why_not.startswith("the bootstrap's 95% interval is not finite (")
    assert "resamples of the seeds gave no finite multiplier" in fit.why_not


def test_a_rung_with_one_seed_has_no_bootstrap_interval_and_a_diverged_seed_is_left_out():
    variant = ladder(compute_multiplier=1.3, seed=1)
    variant[1e13] = [variant[1e13][0], math.nan, math.inf]  # two seeds diverged
    fit = fit_ladder(ladder(), variant)
    assert not fit.testable and fit.interval is None
    assert fit.why_not == ("the variant arm has fewer than 2 seeds with a finite loss at 1e+13 FLOPs: a seed "
                           "bootstrap needs 2 a rung")
    assert fit.multiplier == pytest.approx(1.3, rel=0.05)  # the point estimate is kept for the reader


@pytest.mark.parametrize("compute", [0.0, -1e12, math.nan])
def test_a_rung_without_a_positive_compute_is_a_user_error(compute):
    with pytest.raises(GatelabError, match=r"ladder of the baseline arm: a rung's compute is .*positive number"):
        fit_ladder({compute: [3.0, 3.1], **ladder()}, ladder())


def test_the_wall_clock_multiplier_is_the_compute_multiplier_times_the_speed_ratio():
    assert wall_clock_multiplier(1.3, 0.8).multiplier == pytest.approx(1.04)
    assert wall_clock_multiplier(1.3, 0.8, compute_interval=(1.2, 1.4)).interval is None
    worth = wall_clock_multiplier(1.3, 0.8, (1.2, 1.4), (0.75, 0.85))
    low, high = worth.interval
    assert low < 1.04 < high
    assert 1.04 / low > 1.3 / 1.2 and high / 1.04 > 1.4 / 1.3  # wider than either factor's alone


def test_the_ladder_plot_writes_a_png_and_a_no_data_figure(tmp_path):
    baseline, variant = ladder(), ladder(compute_multiplier=1.3, seed=1)
    fits = {"g1": fit_ladder(baseline, variant, resamples=100), "g2": fit_ladder(baseline, ladder(RUNGS[:2]))}
    assert_drawn(lambda p: plot_ladder({"baseline": baseline, "g1": variant}, fits, p), tmp_path / "sub" / "ladder.png")
    assert_no_data(lambda p: plot_ladder({}, {}, p), tmp_path / "empty.png")
    assert_no_data(lambda p: plot_ladder({"baseline": {1e12: [math.nan]}}, {}, p), tmp_path / "diverged.png")
