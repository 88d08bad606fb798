"""A real text corpus that exists offline on every machine: the Python standard library's own source.

Tokens are bytes (vocabulary 256), so no tokenizer has to be built or downloaded. Files are taken in
sorted order from the running Python's standard library, so the corpus is the same on every machine with
the same Python version (it differs slightly between Python versions; records note the version).
Batches are a pure function of ``(seed, step)``.
"""

from __future__ import annotations

import functools
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB_SIZE = 256


# Folders left out: third-party packages, and test suites (Debian and Ubuntu ship the standard library's
# tests in a separate package, so including them would make the corpus differ between installs).
_SKIPPED_FOLDERS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_source_files() -> list[Path]:
    """The standard library's ``*.py`` files: the top-level modules sorted by name, then the packages'.

    Top-level modules come first so that a small corpus is the same as it always was; the packages
    (without their test suites) follow, sorted by relative path, for corpora larger than the top level
    alone (about 4.7 MB on Python 3.11 and 3.12).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    top = sorted(p for p in root.glob("*.py") if p.is_file())
    nested = sorted(
        (p for p in root.glob("*/**/*.py")
         if p.is_file() and not (_SKIPPED_FOLDERS & set(p.relative_to(root).parts[:-1]))),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    files = top + nested
    if not files:
        raise RuntimeError(f"no Python source files found in the standard library folder {root}")
    return files


@dataclass(frozen=True)
class Corpus:
    """Byte tokens of the corpus (uint8 tensor on the CPU) and the files they came from."""

    tokens: torch.Tensor
    files: tuple[str, ...]

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.numel())


def load_corpus(n_bytes: int) -> Corpus:
    """The first ``n_bytes`` bytes of the standard library's sources (files concatenated in order)."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, int):
        raise TypeError(f"n_bytes must be an int, got {type(n_bytes).__name__}")
    if n_bytes < 1024:
        raise ValueError(f"n_bytes must be at least 1024, got {n_bytes}")
    return _load_corpus(n_bytes)


@functools.lru_cache(maxsize=4)
def _load_corpus(n_bytes: int) -> Corpus:
    # Cached: walking the standard library takes about half a second, and a lesson trains many runs on the
    # same corpus. The samplers only read the tokens.
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, used, total = [], [], 0
    for path in stdlib_source_files():
        data = path.read_bytes()
        chunks.append(data[: n_bytes - total])
        used.append(path.relative_to(root).as_posix())
        total += len(chunks[-1])
        if total >= n_bytes:
            break
    if total < n_bytes:
        raise ValueError(f"the standard library of this Python holds only {total} bytes of sources "
                         f"(tests and site-packages left out); asked for {n_bytes}")
    tokens = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).clone()
    return Corpus(tokens=tokens, files=tuple(used))


@dataclass(frozen=True)
class BatchSampler:
    """Deterministic random windows of a corpus for next-byte prediction.

    ``split`` ``"train"`` uses the first 90% of the tokens, ``"val"`` the last 10%.
    """

    corpus: Corpus
    batch_size: int
    context: int
    seed: int = 0
    split: str = "train"

    def __post_init__(self) -> None:
        if self.split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {self.split!r}")
        if self.batch_size < 1 or self.context < 1:
            raise ValueError("batch_size and context must be positive")
        if self._hi - self._lo <= self.context + 1:
            raise ValueError(f"the {self.split} split has too few tokens for context {self.context}")

    @property
    def _lo(self) -> int:
        return 0 if self.split == "train" else int(self.corpus.n_tokens * 0.9)

    @property
    def _hi(self) -> int:
        return int(self.corpus.n_tokens * 0.9) if self.split == "train" else self.corpus.n_tokens

    def batch(self, step: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (int64, shape ``[batch_size, context]``) for ``step``: same step, same batch."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(step) + (7 if self.split == "val" else 0))
        starts = torch.randint(self._lo, self._hi - self.context - 1, (self.batch_size,), generator=gen)
        offsets = torch.arange(self.context + 1)
        windows = self.corpus.tokens[starts[:, None] + offsets[None, :]].to(torch.int64)
        return windows[:, :-1].to(device), windows[:, 1:].to(device)
