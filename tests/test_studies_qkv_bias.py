import pytest

from course_lib.device import SizeProfile
from course_lib.glue import Prose
from course_lib.studies import qkv_bias as Q


def test_the_key_third_of_the_qkv_bias_gradient_is_what_fp16_flushes():
    # a key bias adds one amount to all of a query's scores, which the softmax ignores: its gradient is
    # rounding noise, below half FP16's smallest subnormal, while the query and value thirds are not
    shares = Q.qkv_bias_thirds(SizeProfile("small"))
    assert list(shares) == ["blocks.0.attn.qkv.bias", "blocks.1.attn.qkv.bias"]
    for s in shares.values():
        assert s["key"] > 90 and s["query"] < 1 and s["value"] < 1
    with pytest.raises(TypeError, match="seed must be an int"):
        Q.qkv_bias_thirds(SizeProfile("small"), seed=0.5)
    text = Q.qkv_thirds_sentence(shares)
    assert isinstance(text, Prose) and text.endswith("what flushes in each is mostly the key third")


def test_qkv_thirds_sentence_reads_its_numbers_and_both_verdicts():
    one = {"blocks.0.attn.qkv.bias": {"query": 1.0, "key": 60.0, "value": 2.5}}
    assert Q.qkv_thirds_sentence(one).endswith(
        "would flush is query 1.0%, key 60.0% and value 2.5% in `blocks.0.attn.qkv.bias`: what flushes in it is "
        "mostly the key third")
    two = {**one, "blocks.1.attn.qkv.bias": {"query": 30.0, "key": 40.0, "value": 20.0}}   # 40 < 30 + 20
    text = Q.qkv_thirds_sentence(two)
    assert "in `blocks.0.attn.qkv.bias`; query 30.0%" in text
    assert text.endswith("the key third does not hold most of what flushes in every one here")
    for bad in ({}, {"b": {"query": 1.0, "key": 2.0}}):
        with pytest.raises(ValueError, match="query, key, value shares"):
            Q.qkv_thirds_sentence(bad)
