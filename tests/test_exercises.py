import pytest

from course_lib.exercises import check_format_property


def test_correct_answers_pass_including_rounded_decimals():
    assert check_format_property("FP8 E5M2", "max_finite", 57344).correct
    assert check_format_property("FP16", "min_subnormal", 6e-8).correct
    assert check_format_property("FP8 E4M3", "min_subnormal", 2**-9).correct


@pytest.mark.parametrize("fmt,prop,answer,hint", [
    ("FP8 E5M2", "max_finite", 114688, "holds only inf and NaN"),
    ("FP8 E4M3", "max_finite", 240, "only the all-ones code is NaN"),
    ("FP16", "min_subnormal", 2**-14, "smallest *normal*"),
    ("FP16", "min_normal", 2**-24, "smallest *subnormal*"),
    ("FP16", "epsilon", 2**-11, "half an epsilon"),
    ("FP16", "max_finite", 32768, "largest power of two"),
    ("FP16", "max_finite", 12345, "Write out the bits"),
    ("FP16", "max_finite", None, "No answer yet"),
    ("FP16", "max_finite", "65504", "Give a number"),
])
def test_wrong_answers_are_explained(fmt, prop, answer, hint):
    fb = check_format_property(fmt, prop, answer)
    assert not fb.correct and hint in fb.message
    assert fb._repr_markdown_().startswith("❌")


def test_unknown_property():
    with pytest.raises(ValueError, match="prop must be one of"):
        check_format_property("FP16", "colour", 1)
