import math

import pytest
import torch

from course_lib.data import BatchSampler, load_corpus
from course_lib.device import SizeProfile
from course_lib.models import GPTConfig, build_gpt, gpt_config_for


def test_corpus_is_deterministic_python_source():
    a, b = load_corpus(50_000), load_corpus(50_000)
    assert a.n_tokens == 50_000 and torch.equal(a.tokens, b.tokens) and a.files == b.files
    assert b"def " in bytes(a.tokens.tolist())


def test_full_profile_corpus_exists_and_starts_with_the_small_one():
    # The full profile's corpus must exist on any Python (a GPU image's standard library too: its
    # top-level modules alone hold under 5 MB), and a small corpus is the prefix of a larger one.
    from course_lib.models import FULL_CORPUS_BYTES

    full, small = load_corpus(FULL_CORPUS_BYTES), load_corpus(1_000_000)
    assert full.n_tokens == FULL_CORPUS_BYTES
    assert torch.equal(full.tokens[:1_000_000], small.tokens)
    assert not any({"test", "tests", "site-packages"} & set(f.split("/")) for f in full.files)


def test_batches_are_a_function_of_seed_and_step():
    corpus = load_corpus(50_000)
    s = BatchSampler(corpus, 4, 32, seed=1)
    x0, y0 = s.batch(0)
    x0b, _ = s.batch(0)
    x1, _ = s.batch(1)
    assert torch.equal(x0, x0b) and not torch.equal(x0, x1)
    assert x0.shape == (4, 32) and x0.dtype == torch.int64
    assert torch.equal(x0[:, 1:], y0[:, :-1])  # targets are the inputs shifted by one byte
    v, _ = BatchSampler(corpus, 4, 32, split="val").batch(0)
    assert int(v.numel()) == 128


def test_data_bad_input():
    with pytest.raises(ValueError, match="at least 1024"):
        load_corpus(10)
    with pytest.raises(TypeError, match="n_bytes must be an int"):
        load_corpus(1e6)
    with pytest.raises(ValueError, match="split must be"):
        BatchSampler(load_corpus(5000), 2, 8, split="test")


def test_model_shapes_initial_loss_and_determinism():
    cfg = GPTConfig(d_model=64, n_layers=1, n_heads=2, context=16)
    m = build_gpt(cfg, seed=3)
    idx = torch.randint(0, 256, (2, 16))
    logits, loss = m(idx, idx)
    assert logits.shape == (2, 16, 256)
    assert loss.item() == pytest.approx(math.log(256), rel=0.05)  # near-uniform predictions at init
    m2 = build_gpt(cfg, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), m2.parameters()))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_model_is_causal():
    m = build_gpt(GPTConfig(d_model=64, n_layers=2, n_heads=2, context=16), seed=0)
    idx = torch.randint(0, 256, (1, 16))
    changed = idx.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 256
    a, _ = m(idx)
    b, _ = m(changed)
    assert torch.allclose(a[0, :10], b[0, :10]) and not torch.allclose(a[0, 10:], b[0, 10:])


def test_config_validation_and_profiles():
    with pytest.raises(ValueError, match="multiple of 64"):
        GPTConfig(d_model=100)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        GPTConfig(d_model=64, n_heads=3)
    with pytest.raises(ValueError, match="positive int"):
        GPTConfig(n_layers=0)
    assert gpt_config_for(SizeProfile("small")).d_model < gpt_config_for(SizeProfile("full")).d_model


# ---- fused attention, tied head, the analytic parameter count ---------------------------------------------

def test_sdpa_attention_matches_the_explicit_path_in_fp32():
    from dataclasses import replace

    cfg = GPTConfig(d_model=128, n_layers=2, n_heads=4, context=32)
    explicit, fused = build_gpt(cfg, seed=3), build_gpt(replace(cfg, attention="sdpa"), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(explicit.parameters(), fused.parameters()))  # same weights
    x = torch.randint(0, cfg.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    (la, loss_a), (lb, loss_b) = explicit(x, x), fused(x, x)
    torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-5)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(explicit.named_parameters(), fused.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-4, atol=1e-6, msg=name)
    # the fused path really is another computation, not the same ops: its forward has no softmax op
    ops = []
    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))
    with Spy():
        fused(x)
    assert not any("_softmax" in o for o in ops)


def test_scaled_first_attention_computes_the_same_function_and_keeps_fp16_in_range():
    from dataclasses import replace

    from course_lib.models import set_attention

    cfg = GPTConfig(d_model=64, n_layers=1, n_heads=2, context=16)
    model = build_gpt(cfg, seed=0)
    first = build_gpt(replace(cfg, attention="scaled_first"), seed=0)
    x = torch.arange(24).reshape(2, 12) % cfg.vocab_size
    torch.testing.assert_close(first(x)[0], model(x)[0], rtol=1e-5, atol=1e-5)
    # with q and k this large, q @ k^T overflows FP16 (max 65504); scaled by 1/sqrt(32) first, it fits
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(400)
    attn = model.blocks[0].attn
    h = model.blocks[0].ln1(model.tok_emb(x) + model.pos_emb(torch.arange(12)))
    with torch.autocast("cpu", dtype=torch.float16):
        assert not torch.isfinite(attn(h)).all()
        set_attention(model, "scaled_first")
        assert attn.attention == "scaled_first" and torch.isfinite(attn(h)).all()
    with pytest.raises(ValueError, match="'flash'"):
        set_attention(model, "flash")
    with pytest.raises(TypeError, match="nn.Module"):
        set_attention("model", "sdpa")


def test_the_explicit_path_is_the_default_and_unchanged():
    cfg = GPTConfig(d_model=64, n_layers=1, n_heads=2, context=16)
    assert cfg.attention == "explicit" and cfg.tied_head is False
    model = build_gpt(cfg, seed=0)
    x = torch.arange(12).reshape(2, 6) % cfg.vocab_size
    attn = model.blocks[0].attn
    h = model.blocks[0].ln1(model.tok_emb(x) + model.pos_emb(torch.arange(6)))
    q, k, v = attn.qkv(h).split(64, dim=2)
    q, k, v = (z.view(2, 6, 2, 32).transpose(1, 2) for z in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(32)
    scores = scores.masked_fill(~torch.tril(torch.ones(6, 6, dtype=torch.bool)), float("-inf"))
    expected = attn.proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 6, 64))
    assert torch.equal(attn(h), expected)   # bit for bit: the written-out attention, as before


def test_config_attention_and_tied_head_validation_and_old_records():
    from course_lib.jsonable import from_jsonable

    with pytest.raises(ValueError, match="'explicit', 'scaled_first', 'sdpa'.*'flash'"):
        GPTConfig(attention="flash")
    with pytest.raises(ValueError, match="tied_head must be a bool"):
        GPTConfig(tied_head=1)
    old = {"d_model": 64, "n_layers": 2, "n_heads": 2, "context": 64, "vocab_size": 256, "mlp_ratio": 4}
    assert from_jsonable(GPTConfig, old) == GPTConfig()   # a record written before the fields loads


@pytest.mark.parametrize("cfg", [GPTConfig(), GPTConfig(d_model=128, n_layers=3, n_heads=4, context=48, mlp_ratio=2),
                                 GPTConfig(d_model=192, n_layers=2, n_heads=3, vocab_size=320, tied_head=True)])
def test_parameter_count_from_the_shape_matches_the_module(cfg):
    from course_lib.models import count_parameters

    model = build_gpt(cfg)
    assert count_parameters(model)[0] == cfg.parameter_count()
    if cfg.tied_head:
        assert model.head.weight is model.tok_emb.weight   # one tensor, counted once
        untied = build_gpt(GPTConfig(d_model=192, n_layers=2, n_heads=3, vocab_size=320))
        assert count_parameters(untied)[0] - count_parameters(model)[0] == 320 * 192
