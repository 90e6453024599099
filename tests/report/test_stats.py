"""gatelab.report.stats against answers worked out independently of the code under test.

Expected p-values come from closed forms of the t distribution, not from the SciPy test being wrapped:
  df = 1 (Cauchy):  two-sided p = 1 - (2/pi) * atan(|t|)
  df = 2:           two-sided p = 1 - |t| / sqrt(t^2 + 2)
  any df:           two-sided p = I_{df/(df+t^2)}(df/2, 1/2)   (regularized incomplete beta)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import special, stats

from gatelab.report.stats import (
    Comparison,
    benjamini_hochberg,
    compare,
    compare_shared_seeds,
    kendall_tau_b,
    lr_sensitivity,
    mean_std,
    minimum_detectable_effect,
    rank_agreement,
    rank_agreement_interval,
    seeds_needed,
    sign_agreement,
    tost,
)

NAN = math.nan


# --- paired t -------------------------------------------------------------------------------------------------------

def test_paired_differences_1_2_3_by_hand():
    # Differences [1, 2, 3]: mean 2, sd sqrt(((1-2)^2 + 0 + (3-2)^2) / 2) = 1, SE = 1/sqrt(3),
    # t = 2 / (1/sqrt(3)) = 2*sqrt(3) = 3.4641, df 2: p = 1 - t/sqrt(t^2 + 2) = 1 - sqrt(12/14) = 0.0741799.
    result = compare({0: 11.0, 1: 22.0, 2: 33.0}, {0: 10.0, 1: 20.0, 2: 30.0})
    assert result.test == "paired t"
    assert result.n == 3
    assert result.delta == pytest.approx(2.0)
    assert result.sd == pytest.approx(1.0)
    assert result.p_value == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)
    assert result.p_value == pytest.approx(0.0741799, abs=1e-7)
    assert result.reason is None
    # The power figures are those of this n and sd.
    assert result.mde == pytest.approx(minimum_detectable_effect(1.0, 3, paired=True))
    assert result.seeds_needed == seeds_needed(2.0, 1.0, paired=True)


def test_paired_two_seeds_df_1():
    # Differences [1, 3]: mean 2, sd sqrt(2), SE = sqrt(2)/sqrt(2) = 1, t = 2, df 1:
    # p = 1 - (2/pi) * atan(2) = 1 - 0.704833 = 0.295167.
    result = compare({7: 1.0, 9: 3.0}, {7: 0.0, 9: 0.0})
    assert result.test == "paired t"
    assert result.n == 2
    assert result.p_value == pytest.approx(1 - 2 / math.pi * math.atan(2.0), rel=1e-9)
    assert result.p_value == pytest.approx(0.295167, abs=1e-6)


def test_paired_uses_only_shared_seeds():
    # Seeds 0..2 are shared (differences 1, 2, 3); seed 5 of the variant and seed 6 of the baseline have no partner.
    result = compare({0: 11.0, 1: 22.0, 2: 33.0, 5: 1000.0}, {0: 10.0, 1: 20.0, 2: 30.0, 6: -1000.0})
    assert result.test == "paired t"
    assert result.n == 3
    assert result.delta == pytest.approx(2.0)
    assert result.p_value == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)


def test_pairing_removes_shared_seed_noise():
    # The seed effect (10, 20, 30) is common to both; pairing sees a steady +1 +/- 0.1, Welch only noise.
    variant = {0: 11.1, 1: 20.9, 2: 31.0}
    baseline = {0: 10.0, 1: 20.0, 2: 30.0}
    paired = compare(variant, baseline)
    welch = compare(variant, {seed + 100: value for seed, value in baseline.items()})
    assert paired.test == "paired t" and welch.test == "Welch t"
    assert paired.p_value < 0.01 < 0.5 < welch.p_value


# --- Welch t --------------------------------------------------------------------------------------------------------

def test_welch_equal_spread_df_2():
    # No shared seeds -> Welch. x = [1, 3], y = [4, 6]: means 2 and 5, variances 2 and 2,
    # SE^2 = 2/2 + 2/2 = 2, t = -3/sqrt(2) = -2.1213; df = (1 + 1)^2 / (1^2/1 + 1^2/1) = 2:
    # p = 1 - |t|/sqrt(t^2 + 2) = 1 - sqrt(4.5/6.5) = 1 - 3/sqrt(13) = 0.167950.
    result = compare({1: 1.0, 2: 3.0}, {3: 4.0, 4: 6.0})
    assert result.test == "Welch t"
    assert result.n == 2
    assert result.delta == pytest.approx(-3.0)
    assert result.sd == pytest.approx(math.sqrt(2.0))  # rms of the two sds sqrt(2), sqrt(2)
    assert result.p_value == pytest.approx(1 - 3 / math.sqrt(13), rel=1e-9)
    assert result.p_value == pytest.approx(0.167950, abs=1e-6)


def test_welch_unequal_spread_is_not_student():
    # x = [1, 3] (variance 2), y = [5, 5] (variance 0): SE^2 = 2/2 + 0/2 = 1, t = (2 - 5)/1 = -3,
    # Welch df = (1 + 0)^2 / (1^2/1 + 0) = 1: p = 1 - (2/pi) * atan(3) = 0.204833.
    # Student's pooled test would have df 2 and p = 1 - 3/sqrt(11) = 0.0955; Welch must not give that.
    result = compare({1: 1.0, 2: 3.0}, {3: 5.0, 4: 5.0})
    assert result.test == "Welch t"
    assert result.p_value == pytest.approx(1 - 2 / math.pi * math.atan(3.0), rel=1e-9)
    assert result.p_value == pytest.approx(0.204833, abs=1e-6)
    assert result.p_value != pytest.approx(1 - 3 / math.sqrt(11), abs=1e-3)
    assert result.sd == pytest.approx(1.0)  # sqrt((2 + 0) / 2)


def test_welch_fractional_df_from_formula():
    # x = [1, 2, 3, 4]: mean 2.5, var 5/3; y = [2, 4, 6, 8]: mean 5, var 20/3.
    # a = (5/3)/4 = 5/12, b = (20/3)/4 = 5/3, SE^2 = a + b = 25/12, t^2 = 2.5^2 / (25/12) = 3.
    # Welch-Satterthwaite df = (a + b)^2 / (a^2/3 + b^2/3) = (625/144) / (425/432) = 75/17 = 4.4118.
    t2, df = 3.0, 75 / 17
    expected = special.betainc(df / 2, 0.5, df / (df + t2))
    result = compare({i: float(i) for i in range(1, 5)}, {10 + i: 2.0 * i for i in range(1, 5)})
    assert result.test == "Welch t"
    assert result.n == 4
    assert result.delta == pytest.approx(-2.5)
    assert result.p_value == pytest.approx(expected, rel=1e-9)
    assert 0.1 < result.p_value < 0.2  # between df 4 (0.158) and df 5 (0.144) at t = 1.732


def test_welch_n_is_smaller_group():
    result = compare({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}, {10: 2.0, 11: 3.0})
    assert result.test == "Welch t"
    assert result.n == 2
    assert result.mde == pytest.approx(minimum_detectable_effect(result.sd, 2, paired=False))


# --- edge cases -----------------------------------------------------------------------------------------------------

def test_one_seed():
    result = compare({0: 12.0}, {0: 10.0})
    assert result.test == "Welch t"  # one shared seed is not enough to pair
    assert result.delta == pytest.approx(2.0)
    assert result.p_value is None
    assert result.reason == "one seed: no spread"
    assert result.n == 1 and result.sd is None and result.mde is None and result.seeds_needed is None


def test_one_shared_seed_falls_back_to_welch_over_all_values():
    # Only seed 0 is shared; Welch over x = [1, 3] and y = [4, 6] gives the df-2 case above.
    result = compare({0: 1.0, 1: 3.0}, {0: 4.0, 2: 6.0})
    assert result.test == "Welch t"
    assert result.p_value == pytest.approx(1 - 3 / math.sqrt(13), rel=1e-9)


def test_one_seed_on_one_side():
    result = compare({0: 12.0}, {1: 10.0, 2: 11.0, 3: 12.0})
    assert result.p_value is None
    assert result.reason.startswith("one seed in variant")


def test_zero_variance_paired():
    result = compare({0: 11.0, 1: 21.0, 2: 31.0}, {0: 10.0, 1: 20.0, 2: 30.0})
    assert result.test == "paired t"
    assert result.delta == pytest.approx(1.0)
    assert result.p_value is None and "zero variance" in result.reason
    assert result.sd == 0.0 and result.mde is None and result.seeds_needed is None


def test_zero_variance_up_to_rounding_residue():
    # 10.3 - 10.2, 20.3 - 20.2, 30.3 - 30.2 differ in the last bits; that is not a spread to test against.
    result = compare({0: 10.3, 1: 20.3, 2: 30.3}, {0: 10.2, 1: 20.2, 2: 30.2})
    assert result.p_value is None and "zero variance" in result.reason


def test_zero_variance_welch():
    result = compare({0: 5.0, 1: 5.0}, {2: 4.0, 3: 4.0})
    assert result.test == "Welch t"
    assert result.delta == pytest.approx(1.0)
    assert result.p_value is None and "zero variance" in result.reason


def test_nan_and_inf_are_dropped():
    # Seed 3 diverged in the variant (NaN) and seed 4 overflowed (inf): neither is a pair, the rest is the
    # [1, 2, 3] differences case.
    variant = {0: 11.0, 1: 22.0, 2: 33.0, 3: NAN, 4: math.inf}
    baseline = {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0, 4: 50.0}
    result = compare(variant, baseline)
    assert result.test == "paired t" and result.n == 3
    assert result.p_value == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)


def test_nan_leaving_one_pair_falls_back_to_welch():
    result = compare({0: 1.0, 1: 3.0, 2: NAN}, {0: 4.0, 2: 6.0, 3: NAN})
    assert result.test == "Welch t"  # seed 0 is the only finite pair
    assert result.p_value == pytest.approx(1 - 3 / math.sqrt(13), rel=1e-9)


def test_no_finite_values():
    result = compare({0: NAN}, {0: 10.0, 1: 11.0})
    assert math.isnan(result.delta)
    assert result.p_value is None and "variant" in result.reason


def test_comparison_is_frozen():
    result = compare({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.5})
    assert isinstance(result, Comparison)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.delta = 0.0  # type: ignore[misc]


# --- power ----------------------------------------------------------------------------------------------------------

def test_mde_paired_n10():
    # One-sample t-test, n = 10, alpha 0.05 two-sided, power 0.8: the standard effect size is d ~ 0.99
    # (noncentral-t answer 0.996; at d = 0.994 the power is 0.798).
    mde = minimum_detectable_effect(1.0, 10, paired=True)
    assert mde == pytest.approx(0.99, abs=0.01)
    assert mde == pytest.approx(0.996, abs=0.001)
    assert minimum_detectable_effect(2.5, 10) == pytest.approx(2.5 * mde)  # linear in sd


def test_mde_power_by_simulation():
    # Independent of scipy's noncentral t: simulate the one-sample t-test at the MDE and count rejections.
    # t_{0.975, df 9} = 2.262157 (table value); 200,000 trials give a standard error of 0.0009 on the power.
    mde = minimum_detectable_effect(1.0, 10)
    rng = np.random.default_rng(12345)
    x = rng.standard_normal((200_000, 10)) + mde
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(10))
    assert np.mean(np.abs(t) > 2.262157) == pytest.approx(0.80, abs=0.005)


def test_mde_large_n_is_normal_theory():
    # (z_0.975 + z_0.8) / sqrt(n) = (1.959964 + 0.841621) / 100 = 0.0280159 for n = 10,000.
    assert minimum_detectable_effect(1.0, 10_000) == pytest.approx(0.0280159, rel=2e-3)


def test_mde_welch_n10():
    # Two groups of 10, d for power 0.8 at alpha 0.05 two-sided: 1.32 (Cohen's tables).
    assert minimum_detectable_effect(1.0, 10, paired=False) == pytest.approx(1.325, abs=0.002)


def test_mde_not_computable():
    assert minimum_detectable_effect(1.0, 1) is None
    assert minimum_detectable_effect(None, 10) is None
    assert minimum_detectable_effect(0.0, 10) is None
    assert minimum_detectable_effect(NAN, 10) is None
    assert minimum_detectable_effect(1.0, 2) > minimum_detectable_effect(1.0, 3) > 0  # df 1 still solves
    with pytest.raises(ValueError):
        minimum_detectable_effect(1.0, 10, alpha=0.05, power=0.01)


def test_seeds_needed_paired_d_half():
    # d = 0.5, one-sample (paired) t, alpha 0.05, power 0.8: n = 34 (power 0.808 at 34, 0.795 at 33).
    assert seeds_needed(0.5, 1.0) == 34
    assert seeds_needed(-0.5, 1.0) == 34  # the direction does not matter
    assert minimum_detectable_effect(1.0, 34) <= 0.5 < minimum_detectable_effect(1.0, 33)


def test_seeds_needed_welch_d_half():
    # Cohen's classic: 64 per group for d = 0.5 at alpha 0.05, power 0.8.
    assert seeds_needed(0.5, 1.0, paired=False) == 64


def test_seeds_needed_consistent_with_mde():
    mde = minimum_detectable_effect(1.0, 10)
    assert seeds_needed(mde + 1e-9, 1.0) == 10
    assert seeds_needed(mde - 1e-3, 1.0) == 11


def test_seeds_needed_not_computable():
    assert seeds_needed(0.0, 1.0) is None
    assert seeds_needed(NAN, 1.0) is None
    assert seeds_needed(0.5, None) is None
    assert seeds_needed(0.5, 0.0) is None
    assert seeds_needed(1e-4, 1.0) is None  # would need ~785 million seeds, beyond max_n
    assert seeds_needed(100.0, 1.0) == 2  # never fewer than 2


# --- agreement with the paper ---------------------------------------------------------------------------------------

def test_kendall_identical_order():
    ours = {"a": 10.0, "b": 11.0, "c": 12.0, "d": 13.0}
    paper = {"a": 5.0, "b": 6.0, "c": 7.0, "d": 8.0}
    result = rank_agreement(ours, paper)
    assert result["tau"] == pytest.approx(1.0)
    assert result["n"] == 4
    # Exact null: 1 of the 4! = 24 orders has tau = 1 (and 1 has -1), so two-sided p = 2/24.
    assert result["p_value"] == pytest.approx(2 / 24)
    assert result["reason"] is None


def test_kendall_one_adjacent_swap():
    # 6 pairs among 4 items; swapping b and c makes 1 discordant, 5 concordant: tau = (5 - 1)/6 = 0.667.
    result = rank_agreement({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, {"a": 1.0, "b": 3.0, "c": 2.0, "d": 4.0})
    assert result["tau"] == pytest.approx(4 / 6)


def test_kendall_reversed():
    result = rank_agreement({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0})
    assert result["tau"] == pytest.approx(-1.0)


def test_kendall_shared_finite_keys_only():
    ours = {"a": 1.0, "b": 2.0, "c": 3.0, "d": NAN, "x": 9.0}
    paper = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "y": 9.0}
    result = rank_agreement(ours, paper)
    assert result["n"] == 3 and result["keys"] == ["a", "b", "c"]
    assert result["tau"] == pytest.approx(1.0)


def test_kendall_too_few():
    result = rank_agreement({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert result["tau"] is None and result["p_value"] is None
    assert result["n"] == 2 and result["reason"]


def test_kendall_all_tied():
    result = rank_agreement({"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert result["tau"] is None and "tied" in result["reason"]


def test_sign_agreement():
    ours = {"baseline": 0.0, "a": -0.2, "b": 0.3, "c": -0.1, "d": 0.0, "e": NAN, "f": 0.5}
    paper = {"baseline": 0.0, "a": -0.5, "b": -0.1, "c": -0.4, "d": 0.2, "e": 0.1, "g": 1.0}
    result = sign_agreement(ours, paper)
    # Counted: a (agree), b (disagree), c (agree); baseline, d (zero), e (NaN), f/g (unshared) are left out.
    assert result["n"] == 3
    assert result["agree"] == 2
    assert result["fraction"] == pytest.approx(2 / 3)
    assert result["disagree"] == ["b"]


def test_sign_agreement_empty():
    result = sign_agreement({"baseline": 0.0}, {"baseline": 0.0})
    assert result["n"] == 0 and result["fraction"] is None and result["reason"]


# --- mean_std -------------------------------------------------------------------------------------------------------

def test_mean_std():
    # [1, 2, 3]: mean 2, sample sd sqrt((1 + 0 + 1)/2) = 1; the NaN (a diverged run) is dropped.
    assert mean_std([1.0, 2.0, 3.0, NAN]) == (pytest.approx(2.0), pytest.approx(1.0), 3)
    assert mean_std([5.0]) == (5.0, None, 1)
    mean, std, n = mean_std([NAN])
    assert math.isnan(mean) and std is None and n == 0


# --- the claims table's statistics ----------------------------------------------------------------------------------
# Expected figures from statsmodels 0.15.0, computed once and written here, so the suite does not need statsmodels:
#   ttost_paired(x1, x2, -1, 1), ttost_ind(y1, y2, -0.5, 0.5, usevar="unequal"), multipletests(p, method="fdr_bh").

TOST_X1, TOST_X2 = [10.2, 11.5, 9.8, 12.1, 10.9], [10.0, 11.9, 9.5, 12.4, 10.1]
TOST_Y1, TOST_Y2 = [5.1, 4.8, 5.6, 5.0], [4.7, 5.3, 4.9, 5.2, 5.0]
BH_P = [0.01, 0.04, 0.03, 0.005, 0.20, 0.5, 0.049]
BH_Q = [0.035, 0.0686, 0.0686, 0.035, 0.23333333333333334, 0.5, 0.0686]


def test_tost_paired_matches_statsmodels():
    result = tost(TOST_X1, TOST_X2, margin=1.0, paired=True)
    assert result.test == "paired t" and result.n == 5
    assert result.delta == pytest.approx(0.12)
    assert result.p_value == pytest.approx(0.007789291145422637, rel=1e-9)
    # The 95% interval of the mean difference, d = [0.2, -0.4, 0.3, -0.3, 0.8]: 0.12 +- t(0.975, 4) * sd / sqrt(5).
    sd = float(np.std(np.subtract(TOST_X1, TOST_X2), ddof=1))
    half = 2.7764451051977987 * sd / math.sqrt(5)
    assert result.interval == pytest.approx((0.12 - half, 0.12 + half))


def test_tost_welch_matches_statsmodels():
    result = tost(TOST_Y1, TOST_Y2, margin=0.5, paired=False)
    assert result.test == "Welch t" and result.n == 4
    assert result.p_value == pytest.approx(0.052009147487064145, rel=1e-9)


def test_tost_against_statsmodels_live():
    weightstats = pytest.importorskip("statsmodels.stats.weightstats")
    for margin in (0.3, 1.0, 2.5):
        expected = weightstats.ttost_paired(np.array(TOST_X1), np.array(TOST_X2), -margin, margin)[0]
        assert tost(TOST_X1, TOST_X2, margin, paired=True).p_value == pytest.approx(expected, rel=1e-9)
        expected = weightstats.ttost_ind(np.array(TOST_Y1), np.array(TOST_Y2), -margin, margin, usevar="unequal")[0]
        assert tost(TOST_Y1, TOST_Y2, margin, paired=False).p_value == pytest.approx(expected, rel=1e-9)


def test_tost_wide_margin_is_equivalent_narrow_is_not():
    assert tost(TOST_X1, TOST_X2, 5.0, paired=True).p_value < 1e-3
    assert tost(TOST_X1, TOST_X2, 0.05, paired=True).p_value > 0.5


def test_tost_degenerate_cases_say_why():
    assert tost([1.0], [2.0], 1.0, paired=True).reason.startswith("fewer than two")
    assert "margin" in tost([1.0, 2.0], [1.5, 2.5], 0.0, paired=True).reason
    assert "zero variance" in tost([2.0, 3.0], [1.0, 2.0], 1.0, paired=True).reason
    with pytest.raises(ValueError):
        tost([1.0, 2.0, 3.0], [1.0, 2.0], 1.0, paired=True)


def test_benjamini_hochberg_matches_statsmodels():
    assert benjamini_hochberg(BH_P) == pytest.approx(BH_Q, rel=1e-9)
    # By hand for the smallest: 0.005 is rank 1 of 7, 0.005 * 7 = 0.035, and 0.01 (rank 2) gives 0.01 * 7/2 = 0.035.


def test_benjamini_hochberg_leaves_untested_rows_out_of_the_family():
    q = benjamini_hochberg([None, 0.01, None, 0.04])
    assert q[0] is None and q[2] is None
    assert q[1] == pytest.approx(0.02) and q[3] == pytest.approx(0.04)  # a family of two, not four
    assert benjamini_hochberg([]) == [] and benjamini_hochberg([None]) == [None]


def test_benjamini_hochberg_against_statsmodels_live():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    p = np.random.default_rng(3).uniform(0, 0.2, size=25)
    assert benjamini_hochberg(list(p)) == pytest.approx(list(multitest.multipletests(p, method="fdr_bh")[1]))


def test_lr_sensitivity_by_hand():
    # Capped at init 7.0: [5.0, 4.5, 4.0, 7.0 (diverged: NaN), 7.0 (9.0 capped)], mean 27.5 / 5 = 5.5, best 4.0.
    losses = {1e-3: 5.0, 2e-3: 4.5, 4e-3: 4.0, 8e-3: NAN, 1.6e-2: 9.0}
    assert lr_sensitivity(losses, 7.0) == pytest.approx(1.5)
    assert lr_sensitivity({1e-3: 4.0, 2e-3: 4.0}, 7.0) == 0.0  # every rate at the best
    assert lr_sensitivity({1e-3: math.inf, 2e-3: 8.0}, 7.0) == 0.0  # nothing learned anywhere: all at the cap
    assert math.isnan(lr_sensitivity({}, 7.0))


def test_compare_shared_seeds_always_pairs_whatever_r():
    # Seeds 0-2 shared; seed 3 only in a (a wild value that must not reach the mean). a and b rise together: r > 0.
    a, b = {0: 11.0, 1: 22.0, 2: 33.5, 3: 1000.0}, {0: 10.0, 1: 20.0, 2: 30.0}
    together = compare_shared_seeds(a, b)
    assert together.test == "paired t" and together.n == 3
    assert together.correlation == pytest.approx(np.corrcoef([11, 22, 33.5], [10, 20, 30])[0, 1])
    assert together.delta == pytest.approx((11 + 22 + 33.5) / 3 - 20.0)  # over the shared seeds only
    test = stats.ttest_rel([11, 22, 33.5], [10, 20, 30])
    assert together.p_value == pytest.approx(float(test.pvalue))
    assert together.interval == pytest.approx(tuple(test.confidence_interval(0.95)))
    # Against b reversed r < 0: the first pass chose Welch here; the design pairs by seed, so the test is still paired
    opposite = compare_shared_seeds(a, {0: 30.0, 1: 20.0, 2: 10.0})
    assert opposite.test == "paired t" and opposite.correlation < 0
    assert opposite.p_value == pytest.approx(float(stats.ttest_rel([11, 22, 33.5], [30, 20, 10]).pvalue))


def test_compare_shared_seeds_needs_two_shared_seeds():
    result = compare_shared_seeds({0: 1.0, 1: 2.0}, {1: 1.5, 2: 3.0})
    assert result.p_value is None and result.n == 1 and "1 shared seed" in result.reason
    assert result.test == "paired t" and result.delta == pytest.approx(0.5) and result.interval is None
    constant = compare_shared_seeds({0: 1.0, 1: 2.0, 2: 3.0}, {0: 5.0, 1: 5.0, 2: 5.0})
    assert constant.correlation is None and constant.test == "paired t"  # r undefined: a description, not a choice
    assert constant.p_value == pytest.approx(float(stats.ttest_rel([1, 2, 3], [5, 5, 5]).pvalue))


def test_kendall_tau_b_matches_scipy_with_ties_and_gaps():
    ours = np.array([1.0, 2.0, 2.0, 3.0, 5.0, 4.0, NAN, 7.0])
    paper = np.array([2.0, 1.0, 3.0, 3.0, 4.0, 5.0, 6.0, 6.0])
    keep = np.isfinite(ours)
    expected = stats.kendalltau(ours[keep], paper[keep]).statistic
    assert kendall_tau_b(ours, paper)[0] == pytest.approx(expected)
    assert math.isnan(kendall_tau_b(np.array([1.0, NAN, NAN]), np.array([1.0, 2.0, 3.0]))[0])  # fewer than 3


def test_rank_agreement_interval_is_reproducible_and_exact_without_noise():
    paper = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    ordered = {k: {0: v, 1: v + 0.1, 2: v - 0.1} for k, v in paper.items()}
    assert rank_agreement_interval(ordered, paper) == (1.0, 1.0)  # every resample keeps the order
    rng = np.random.default_rng(7)
    noisy = {k: {s: v + 3 * rng.normal() for s in range(4)} for k, v in paper.items()}
    first = rank_agreement_interval(noisy, paper)
    assert first == rank_agreement_interval(noisy, paper)  # the fixed Generator seed
    assert -1.0 <= first[0] <= first[1] <= 1.0 and first[0] < first[1]
    assert rank_agreement_interval({"a": {0: 1.0}, "b": {0: 2.0}}, paper) is None


def test_a_ratio_of_means_pairs_seeds_and_says_why_it_has_no_interval():
    from gatelab.report.stats import ratio_of_means

    result = ratio_of_means({0: 1.2, 1: 2.4, 2: 3.7, 9: 50.0}, {0: 1.0, 1: 2.0, 2: 3.0})  # seed 9 has no pair
    assert result.ratio == pytest.approx(7.3 / 6.0) and result.n == 3
    low, high = result.interval
    assert low < 7.3 / 6.0 < high
    assert ratio_of_means({0: 1.2}, {0: 1.0}).reason == "1 shared seed: no interval"
    assert ratio_of_means({0: 1.2, 1: 2.4}, {0: 1.0, 1: 2.0}).reason == "every seed's ratio is the same: no spread"
    assert ratio_of_means({0: 1.2}, {1: 1.0}).reason == "no shared seeds"
