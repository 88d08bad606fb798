import math

import pytest
import torch

from course_lib.magnitudes import LOG2_LO, TENSOR_KINDS, log2_histogram
from course_lib.jsonable import from_jsonable
from course_lib.studies.formats import TrainingMagnitudes, measure_training_magnitudes
from course_lib.results import to_jsonable


def test_histogram_counts_each_binade_exactly():
    h = log2_histogram(torch.tensor([0.0, 1.0, 1.5, -2.0, 2.0**-20, 2.0**-140, float("inf"), float("nan")]))
    assert (h.zeros, h.nonfinite, h.nonzero, h.total) == (1, 2, 5, 8)
    assert h.counts[0 - LOG2_LO] == 2 and h.counts[1 - LOG2_LO] == 1
    assert h.counts[-20 - LOG2_LO] == 1 and h.counts[-140 - LOG2_LO] == 1
    assert h.min_nonzero == 2.0**-140 and h.max_abs == 2.0
    assert h.fraction_below(2.0) == pytest.approx(5 / 6)  # zero, 1, 1.5, 2**-20, 2**-140 of 6 finite
    assert h.fraction_below(2.0**-30) == pytest.approx(2 / 6)
    assert h.quantile(0.0) == 2.0**-140 and h.quantile(1.0) == 2.0


def test_float64_values_land_in_their_own_binade_or_the_edge_bins():
    """Beyond float32's range too: in float32 these were inf, 0, and (1 - 2**-30) the next binade's 1."""
    x = torch.tensor([1e300, -1e-300, 1.0, 1 - 2.0**-30, 2.0**-1074, 0.0], dtype=torch.float64)
    h = log2_histogram(x)
    assert (h.zeros, h.nonfinite, h.nonzero) == (1, 0, 5)
    assert h.counts[-1] == 1 and h.counts[0] == 2 and h.counts[-LOG2_LO] == 1 and h.counts[-1 - LOG2_LO] == 1
    assert (h.min_nonzero, h.max_abs) == (2.0**-1074, 1e300)
    assert h.fraction_below(2.0**-1074) == 1 / 6  # only the zero
    assert h.fraction_below(1.0) == 4 / 6 and h.fraction_below(1e301) == 1.0


def test_fraction_below_zero_infinity_and_bad_thresholds():
    h = log2_histogram(torch.tensor([0.0, 1.0, 2.0**-20, float("inf")]))
    assert h.fraction_below(0.0) == 0.0  # no magnitude, not even 0, is below 0
    assert h.fraction_below(math.inf) == 1.0  # every finite value is: the inf itself is not counted
    assert h.fraction_below(2.0**-20) == 1 / 3 and h.fraction_below(3.0) == 1.0
    for bad in (-1.0, float("nan"), -math.inf):
        with pytest.raises(ValueError, match="must be >= 0"):
            h.fraction_below(bad)
    with pytest.raises(TypeError, match="real number"):
        h.fraction_below("1e-3")
    assert math.isnan(log2_histogram(torch.tensor([float("nan")])).fraction_below(math.inf))
    assert log2_histogram(torch.zeros(3)).fraction_below(math.inf) == 1.0

def test_quantiles_are_monotone_and_within_a_binade():
    x = torch.exp2(torch.linspace(-30, 10, 100_001))
    h = log2_histogram([x[:50_000], x[50_000:]])
    qs = [h.quantile(q) for q in (0.0, 0.1, 0.5, 0.9, 1.0)]
    assert qs == sorted(qs)
    assert math.log2(h.quantile(0.5)) == pytest.approx(-10, abs=1)
    with pytest.raises(ValueError, match="q must lie"):
        h.quantile(1.5)


def test_histogram_rejects_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        log2_histogram(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="tensor or a list"):
        log2_histogram([1.0])


def test_training_magnitudes_small(small_profile):
    result = measure_training_magnitudes(small_profile, "cpu", steps=5)
    assert set(result.histograms) == set(TENSOR_KINDS)
    assert len(result.loss_history) == 5 and math.isfinite(result.final_loss)
    w = result.histograms["weights"]
    n_params = sum(p.numel() for p in __import__("course_lib.models", fromlist=["x"]).build_gpt(
        result.config).parameters())
    assert w.total == n_params
    # Adam's second moment is a mean of squared gradients: far smaller than the gradients themselves
    assert result.histograms["Adam second moment"].quantile(0.5) < result.histograms["weight gradients"].quantile(0.5)
    back = from_jsonable(TrainingMagnitudes, to_jsonable(result))
    assert back.histograms == result.histograms and back.config == result.config


def test_training_magnitudes_bad_input(small_profile):
    with pytest.raises(TypeError, match="SizeProfile"):
        measure_training_magnitudes("small")
    with pytest.raises(ValueError, match="steps"):
        measure_training_magnitudes(small_profile, steps=-1)
    with pytest.raises(ValueError, match="TrainingMagnitudes needs field 'steps'"):
        from_jsonable(TrainingMagnitudes, {"histograms": {}})
