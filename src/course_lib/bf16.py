"""BF16 against FP16: update stagnation and its fixes, and which format a device should train in.

* :func:`stochastic_round_bf16`: round FP32 to BF16 up or down at random, with probability proportional
  to the distance, so that the rounding is unbiased on average.
* :class:`BF16AdamW`: AdamW for BF16 parameters with FP32 optimizer state, whose update is written back
  to the BF16 weights by round-to-nearest, stochastic rounding, or Kahan-compensated summation.
* :func:`precision_advice`: the recipe a device should use, from its compute capability (tested for
  V100, A100 and H100), not typed into a table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .bench import capability_probe
from .device import describe_hardware
from .hardware import capability_unsupported_reason

UPDATE_RULES = ("nearest", "stochastic", "kahan")


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round an FP32 tensor to BF16 stochastically: each value goes to one of its two BF16 neighbours,
    the upper with probability equal to its distance from the lower over the gap. Exact BF16 values, inf
    and NaN are unchanged. Implemented on the bits: add a uniform random 16-bit integer to the FP32 bit
    pattern and truncate the low 16 bits."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("stochastic_round_bf16 takes a float32 tensor")
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    rounded = ((bits + noise) & ~0xFFFF).view(torch.float32)
    keep = ~torch.isfinite(x)
    return torch.where(keep, x, rounded).to(torch.bfloat16)


class BF16AdamW(torch.optim.Optimizer):
    """AdamW for BF16 parameters, with FP32 moments, and a choice of how the update reaches the weights.

    ``update_rule``: ``"nearest"`` (plain BF16 arithmetic: small updates round away), ``"stochastic"``
    (stochastic rounding: small updates survive on average), or ``"kahan"`` (a BF16 compensation buffer
    carries the part of each update the weight could not absorb into the next step).

    ``state["lost"]`` (per parameter, a 0-d tensor on its device, so a step reads nothing back) counts entries
    whose computed update was non-zero but whose BF16 weight did not change at the last step.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, update_rule: str = "nearest", seed: int = 0):
        if update_rule not in UPDATE_RULES:
            raise ValueError(f"update_rule must be one of {UPDATE_RULES}, got {update_rule!r}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        # the same checks torch.optim.AdamW makes
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be non-negative, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be non-negative, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.update_rule = update_rule
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)   # the CPU's; a GPU's is made on first use
        self._generators: dict[torch.device, torch.Generator] = {torch.device("cpu"): self.generator}

    def generator_for(self, device: torch.device) -> torch.Generator:
        """The stochastic-rounding generator of ``device``, seeded with ``seed`` on first use: random bits are
        drawn where the weights live (no copy to the device a step), and a GPU run repeats seed for seed."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.bfloat16:
                    raise TypeError(f"BF16AdamW updates bfloat16 parameters, got {p.dtype}")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p, dtype=torch.float32)
                    state["v"] = torch.zeros_like(p, dtype=torch.float32)
                    if self.update_rule == "kahan":
                        state["compensation"] = torch.zeros_like(p)  # BF16, like the weights
                state["step"] += 1
                g = p.grad.float()
                state["m"].mul_(beta1).add_(g, alpha=1 - beta1)
                state["v"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat = state["m"] / (1 - beta1 ** state["step"])
                v_hat = state["v"] / (1 - beta2 ** state["step"])
                w = p.float()
                delta = -group["lr"] * (m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * w)
                if self.update_rule == "nearest":
                    new = (w + delta).to(torch.bfloat16)
                elif self.update_rule == "stochastic":
                    new = stochastic_round_bf16(w + delta, self.generator_for(p.device))
                else:
                    wanted = w + delta + state["compensation"].float()
                    new = wanted.to(torch.bfloat16)
                    state["compensation"] = (wanted - new.float()).to(torch.bfloat16)
                state["lost"] = ((delta != 0) & (new == p)).sum()   # a tensor: a step reads nothing back
                p.copy_(new)
        return loss


@dataclass(frozen=True)
class Advice:
    """What to train in on a device: ``recipe`` (a :mod:`course_lib.train` recipe name) and why."""

    device: str
    recipe: str
    why: str
    also: tuple[str, ...] = ()


# (name, compute capability) of the GPUs the lesson asks about
REFERENCE_GPUS = (("V100", (7, 0)), ("T4", (7, 5)), ("A100", (8, 0)), ("H100", (9, 0)))


def precision_advice(compute_capability: tuple[int, int] | None, *, cpu_bf16_speedup: float | None = None,
                     name: str = "") -> Advice:
    """The recipe to train in, from the hardware's capabilities.

    GPUs: compute capability 8.0 and newer have BF16 tensor cores (BF16 autocast, no scaler needed; TF32
    for FP32 products); 7.x have FP16 tensor cores only (FP16 autocast with GradScaler); 8.9 and newer add
    FP8 tensor cores. CPUs (``compute_capability`` None): decided by ``cpu_bf16_speedup``, BF16 matmul
    throughput over FP32's *measured* on that CPU (:func:`course_lib.bench.capability_probe`), never by
    its instruction flags: BF16 autocast where BF16 matmuls measured at least 1.1x FP32, else FP32.
    """
    if compute_capability is None:
        label = name or "CPU"
        if cpu_bf16_speedup is None:
            return Advice(label, "fp32", "BF16 speed on this CPU was not measured; FP32 is the safe default")
        if not cpu_bf16_speedup > 0:
            raise ValueError(f"cpu_bf16_speedup must be a positive ratio, got {cpu_bf16_speedup!r}")
        if cpu_bf16_speedup >= 1.1:
            return Advice(label, "bf16_autocast",
                          f"BF16 matmuls measured {cpu_bf16_speedup:.2f}x FP32's throughput here; a whole "
                          f"training step gains less ({{doc}}`06_performance_memory` measures it)")
        return Advice(label, "fp32", f"BF16 matmuls measured {cpu_bf16_speedup:.2f}x FP32's throughput here: "
                                     f"low precision brings no speed on this CPU")
    if (not isinstance(compute_capability, tuple) or len(compute_capability) != 2
            or not all(isinstance(v, int) for v in compute_capability)):
        raise TypeError(f"compute_capability is a (major, minor) tuple of ints, got {compute_capability!r}")
    label = name or f"GPU sm {compute_capability[0]}.{compute_capability[1]}"
    if capability_unsupported_reason("bf16", compute_capability) is None:
        also = ["tf32 for FP32 matmuls", "fp16_autocast_scaler"]
        if capability_unsupported_reason("fp8", compute_capability) is None:
            also.append("FP8")
        return Advice(label, "bf16_autocast", "BF16 tensor cores: FP32's range, so no loss scaling", tuple(also))
    if capability_unsupported_reason("fp16", compute_capability) is None:
        return Advice(label, "fp16_autocast_scaler", "FP16 tensor cores but no native BF16: FP16 needs "
                                                     "loss scaling for its narrow range")
    return Advice(label, "fp32", "no tensor cores: mixed precision saves memory but little time")


def advice_for_this_machine(device: torch.device | str | None = None) -> Advice:
    """:func:`precision_advice` for the detected hardware."""
    hw = describe_hardware(device)
    if hw.device_type == "cuda":
        major, minor = (int(v) for v in str(hw.compute_capability).split("."))
        return precision_advice((major, minor), name=hw.name)

    return precision_advice(None, cpu_bf16_speedup=capability_probe(hw.device_type).relative("bf16"), name=hw.name)


