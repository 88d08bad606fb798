"""The course's one model thread: a small GPT-style byte-level language model.

Attention is written out (``q @ k.T``, softmax, ``@ v``) rather than fused, so that every op a lesson
talks about (matmul, softmax, layer norm, cross-entropy) is a visible op that autocast and hooks see.
``GPTConfig(attention="sdpa")`` swaps in ``torch.nn.functional.scaled_dot_product_attention`` (fused, the
scores never stored) for the model-size ladder of lesson 6, and ``attention="scaled_first"`` multiplies q by
``1/sqrt(d)`` before ``q @ k.T`` instead of after (the order that keeps the product in FP16's range, lesson
5); ``tied_head=True`` shares the output layer's weight with the token embedding, as GPT-2 does. Dimensions
are multiples of 64, the shapes tensor cores like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .data import VOCAB_SIZE, BatchSampler, load_corpus
from .device import SizeProfile


ATTENTION_KINDS = ("explicit", "scaled_first", "sdpa")


@dataclass(frozen=True)
class GPTConfig:
    """Shape of :class:`TinyGPT`. ``d_model`` must be a multiple of 64 and of ``n_heads``."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    context: int = 64
    vocab_size: int = VOCAB_SIZE
    mlp_ratio: int = 4
    attention: str = "explicit"   # one of ATTENTION_KINDS
    tied_head: bool = False       # the output layer reuses the token embedding's weight (GPT-2)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "context", "vocab_size", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % 64:
            raise ValueError(f"d_model must be a multiple of 64, got {self.d_model}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"GPTConfig.attention must be one of {', '.join(map(repr, ATTENTION_KINDS))}, "
                             f"got {self.attention!r}")
        if not isinstance(self.tied_head, bool):
            raise ValueError(f"GPTConfig.tied_head must be a bool, got {self.tied_head!r}")

    def parameter_count(self) -> int:
        """Trainable parameters of a :class:`TinyGPT` of this shape, counted from the shape alone: the
        embeddings, per block ``(4 + 2 * mlp_ratio) * d**2`` weights plus ``(9 + mlp_ratio) * d`` biases and
        norm parameters, the final norm, and the output layer unless it is tied to the embedding."""
        d, f = self.d_model, self.mlp_ratio * self.d_model
        block = 4 * d * d + 2 * d * f + 4 * d + f + d + 4 * d   # qkv+proj, fc+out, their biases, two norms
        head = 0 if self.tied_head else self.vocab_size * d
        return self.vocab_size * d + self.context * d + self.n_layers * block + 2 * d + head


def gpt_config_for(profile: SizeProfile) -> GPTConfig:
    """The course model's shape for a size profile (small: trains in seconds on a CPU).

    The full profile is a wider model trained for few steps: at 384 wide (its shape until 2026-11-25, kept in
    :data:`course_lib.results.EARLIER_FULL_MODEL`) an H100's 16-bit step was bound by kernel launches, so a
    wider model costs a 16-bit step little, and fewer steps keep every lesson within minutes on one GPU.
    """
    return profile.pick(
        small=GPTConfig(d_model=64, n_layers=2, n_heads=2, context=64),
        full=GPTConfig(d_model=512, n_layers=6, n_heads=8, context=256),
    )


def course_batch(profile: SizeProfile) -> int:
    """Sequences per training step of the course model at ``profile``."""
    return profile.pick(small=16, full=64)


def profile_model(profile: SizeProfile) -> dict[str, int]:
    """The course model's shape and batch at ``profile``, as a record stores it (``course_model``)."""
    cfg = gpt_config_for(profile)
    return {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "context": cfg.context,
            "batch": course_batch(profile)}


class CausalSelfAttention(nn.Module):
    mask: torch.Tensor
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.attention = cfg.attention
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        mask = torch.tril(torch.ones(cfg.context, cfg.context, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            return self.proj(y)
        scale = 1.0 / math.sqrt(c // self.n_heads)
        if self.attention == "scaled_first":
            scores = (q * scale) @ k.transpose(-2, -1)
        else:
            scores = (q @ k.transpose(-2, -1)) * scale
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        attn = F.softmax(scores, dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.out = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """Byte-level GPT: embeddings, ``n_layers`` pre-norm blocks, final norm, untied output head."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        if cfg.tied_head:
            self.head.weight = self.tok_emb.weight

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits ``[batch, time, vocab]`` and, when ``targets`` are given, the mean cross-entropy."""
        t = idx.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.cfg.context}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def set_attention(model: nn.Module, kind: str) -> nn.Module:
    """Switch every attention layer of ``model`` to ``kind`` (one of :data:`ATTENTION_KINDS`) in place, the
    weights untouched: the same trained model, its attention computed another way. Returns ``model``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(map(repr, ATTENTION_KINDS))}, got {kind!r}")
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.attention = kind
    return model


def build_gpt(cfg: GPTConfig, *, seed: int = 0, device: torch.device | str = "cpu") -> TinyGPT:
    """A freshly initialised :class:`TinyGPT`, identical for the same ``cfg`` and ``seed``."""
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = TinyGPT(cfg)
    finally:
        torch.random.set_rng_state(gen_state)
    return model.to(device)


class DeepMLP(nn.Module):
    """A deep plain MLP (Linear + tanh, no normalisation, no residuals): the extreme underflow case.

    With a small initial weight scale, each layer shrinks the backward signal, so the gradients of the
    first layers are orders of magnitude smaller than those of the last.
    """

    def __init__(self, width: int = 64, depth: int = 16, init_std: float = 0.5, seed: int = 0):
        super().__init__()
        for name, value in (("width", width), ("depth", depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not init_std > 0:
            raise ValueError(f"init_std must be positive, got {init_std}")
        gen_state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
            for layer in self.layers:
                assert isinstance(layer, nn.Linear)
                nn.init.normal_(layer.weight, std=init_std / math.sqrt(width))
                nn.init.zeros_(layer.bias)
        finally:
            torch.random.set_rng_state(gen_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


def regression_batch(width: int, batch_size: int, step: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic synthetic regression batch for :class:`DeepMLP`: inputs N(0, 1), targets
    ``sin`` of a fixed random projection of the inputs (same ``(seed, step)``, same batch)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch_size, width, generator=gen)
    proj = torch.randn(width, width, generator=torch.Generator().manual_seed(seed + 12345)) / math.sqrt(width)
    return x, torch.sin(x @ proj)


@dataclass(frozen=True)
class CourseSetup:
    """What every training experiment on the course model starts from, sized by the profile."""

    config: GPTConfig
    sampler: BatchSampler
    steps: int
    device: torch.device

    def model(self, seed: int = 0) -> TinyGPT:
        """A fresh model; the same ``seed`` gives the same initial weights in every run."""
        return build_gpt(self.config, seed=seed, device=self.device)


# The full profile's corpus: every Python from 3.10 on carries more than this in its standard library's
# sources without the test suites (about 12 MB on 3.11), so the same corpus exists on any GPU image.
FULL_CORPUS_BYTES = 8_000_000


def course_setup(profile: SizeProfile, device: torch.device | str = "cpu", *, steps: int | None,
                 default_steps: tuple[int, int], seed: int = 0) -> CourseSetup:
    """Model shape, batches and step count for an experiment on the course model.

    ``default_steps`` is ``(small, full)``, used when ``steps`` is None. Batch size and corpus size come
    from the profile.
    """
    if not isinstance(profile, SizeProfile):
        raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
    steps = profile.pick(small=default_steps[0], full=default_steps[1]) if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if profile.max_steps is not None:
        steps = min(steps, profile.max_steps)
    cfg = gpt_config_for(profile)
    sampler = BatchSampler(load_corpus(profile.pick(small=1_000_000, full=FULL_CORPUS_BYTES)),
                           course_batch(profile), cfg.context, seed=seed)
    return CourseSetup(cfg, sampler, steps, torch.device(device))


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(all, non_embedding)`` trainable parameter counts (embedding tables excluded from the second)."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    emb = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)
              for p in m.parameters() if p.requires_grad)
    return total, total - emb
