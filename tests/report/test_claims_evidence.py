"""What a claim's row weighs: the derived A.3 sparsity metric, and loss spikes counted against the baseline runs' own
noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gatelab.report import claims_evidence as E
from gatelab.report.tables import RunRecord
from tests.helpers import REPO


def test_the_a3_sparsity_metric_is_the_gated_share_minus_the_mean_gate_controls():
    metrics = {"probe/sparsity_gated_output_below_0.01": 0.141, "probe/sparsity_control_output_below_0.01": 0.100}
    assert E.DERIVED["sparsity_over_mean_gate"](metrics) == pytest.approx(0.041)
    assert math.isnan(E.DERIVED["sparsity_over_mean_gate"]({}))


def test_loss_spikes_are_counted_against_the_baselines_own_noise():
    from gatelab.sweep.spec import expand, load_sweep

    specs = {spec.experiment.variant: spec for spec in expand(load_sweep(REPO / "sweeps" / "repro-trained-long.yaml"))
             if spec.experiment.seed == 0}
    rng = np.random.default_rng(0)
    steps = list(range(0, 1800, 20))
    smooth = [3.0 - 0.0005 * s + 0.01 * rng.normal() for s in steps]  # noise of 0.01 nats between logged steps
    spiky = list(smooth)
    spiky[50] += 0.5  # one rise far beyond the baseline's noise
    histories = {"base": (steps, smooth), "gate": (steps, spiky)}
    records = [RunRecord(specs["baseline"], "finished", "base"),
               RunRecord(specs["g1_elem_sig"], "finished", "gate")]
    E.count_loss_spikes(records, histories.__getitem__)
    assert records[0].metrics[E.LOSS_SPIKES] == 0 and records[1].metrics[E.LOSS_SPIKES] == 1
    threshold = records[0].metrics[f"{E.LOSS_SPIKES}_threshold"]
    assert 4 * 0.01 < threshold < 4 * 0.03  # 4 x the noise of a difference of two N(0, 0.01) draws, about 0.057
    assert "x the baseline runs' noise" in E.spike_rule(records)
    # without baseline runs nothing is counted, and the row says so
    alone = [RunRecord(specs["g1_elem_sig"], "finished", "gate")]
    E.count_loss_spikes(alone, histories.__getitem__)
    assert E.LOSS_SPIKES not in alone[0].metrics and "not counted" in E.spike_rule(alone)
