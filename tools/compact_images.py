"""Shrink the built book's figures: each opaque PNG is stored with a palette of at most 256 colours when
that changes no pixel visibly.

    python tools/compact_images.py _build/html/_images

The lessons' figures are matplotlib line and bar charts on white, rendered at 150 dpi: a few thousand
colours, nearly all of them the anti-aliased edges of a few lines. As a palette image a figure takes about
a third of its bytes, and the heaviest lesson stays under the browser check's page weight. A figure is
rewritten only when the palette version is smaller and its peak signal-to-noise ratio against the
original is at least ``--min-psnr`` dB (40 by default: an error of about 2.6 of 255 per channel,
root-mean-square); an image with any transparent pixel is left as it is. The notebooks keep the
original PNGs: only the built site's copies change.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

DEFAULT_MIN_PSNR = 40.0


@dataclass(frozen=True)
class Compaction:
    path: Path
    before: int          # bytes
    after: int           # bytes on disk now (== before when the file was kept)
    psnr: float | None   # dB of the palette version against the original; None when none was made
    reason: str          # "compacted", or why the file was kept

    @property
    def changed(self) -> bool:
        return self.after != self.before


def psnr(original: np.ndarray, other: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two uint8 images of one shape (inf where they are equal)."""
    if original.shape != other.shape:
        raise ValueError(f"images differ in shape: {original.shape} against {other.shape}")
    mse = float(np.mean((original.astype(np.float64) - other.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _check_min_psnr(min_psnr: float) -> float:
    if isinstance(min_psnr, bool) or not isinstance(min_psnr, (int, float)) or not min_psnr > 0:
        raise ValueError(f"min_psnr must be a positive number of dB, got {min_psnr!r}")
    return float(min_psnr)


def compact_png(path: Path | str, min_psnr: float = DEFAULT_MIN_PSNR) -> Compaction:
    """Rewrite the PNG at ``path`` with a palette of at most 256 colours where that is smaller and at
    least ``min_psnr`` dB from the original; otherwise leave the file untouched."""
    min_psnr = _check_min_psnr(min_psnr)
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such file: {path}")
    data = path.read_bytes()
    before = len(data)
    with Image.open(io.BytesIO(data)) as image:
        if image.format != "PNG":
            raise ValueError(f"{path} is not a PNG (it is {image.format})")
        if image.mode == "P":
            return Compaction(path, before, before, None, "already a palette image")
        rgba = image.convert("RGBA")
    alpha = np.asarray(rgba)[..., 3]
    if alpha.min() < 255:
        return Compaction(path, before, before, None, "has transparent pixels")
    rgb = rgba.convert("RGB")
    palette = rgb.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    quality = psnr(np.asarray(rgb), np.asarray(palette.convert("RGB")))
    if quality < min_psnr:
        return Compaction(path, before, before, quality, f"{quality:.1f} dB is below {min_psnr:g} dB")
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    if out.tell() >= before:
        return Compaction(path, before, before, quality, "the palette version is not smaller")
    path.write_bytes(out.getvalue())
    return Compaction(path, before, out.tell(), quality, "compacted")


def compact_folder(folder: Path | str, min_psnr: float = DEFAULT_MIN_PSNR) -> list[Compaction]:
    """:func:`compact_png` on every ``*.png`` directly in ``folder``, in name order."""
    min_psnr = _check_min_psnr(min_psnr)
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"no such folder: {folder}")
    return [compact_png(p, min_psnr) for p in sorted(folder.glob("*.png"))]


def summary(results: list[Compaction]) -> str:
    before = sum(r.before for r in results)
    after = sum(r.after for r in results)
    changed = sum(r.changed for r in results)
    share = f", {after / before:.0%} of the bytes" if before else ""
    return f"compacted {changed} of {len(results)} PNGs: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB{share}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the built book's image folder, e.g. _build/html/_images")
    parser.add_argument("--min-psnr", type=float, default=DEFAULT_MIN_PSNR,
                        help="the lowest peak signal-to-noise ratio (dB) a palette version may have")
    args = parser.parse_args(argv)
    try:
        results = compact_folder(args.folder, args.min_psnr)
    except ValueError as error:
        print(f"compact_images: {error}", file=sys.stderr)
        return 2
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
