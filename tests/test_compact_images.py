"""tools/compact_images.py: the built book's figures become palette PNGs only where no pixel changes visibly."""

import io
import math
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from PIL import Image

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import compact_images as ci  # noqa: E402


def _line_chart(path: Path) -> Path:
    """A figure like the lessons': anti-aliased lines, a shaded band, text, on white, at 150 dpi."""
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.linspace(0, 10, 200)
    for k, style in enumerate(["-", "--", ":", "-."]):
        ax.plot(x, np.sin(x + k) / (k + 1), style, label=f"run {k}")
    ax.fill_between(x, -0.2, 0.2, alpha=0.2)
    ax.set_xlabel("training step")
    ax.legend()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def test_a_line_chart_becomes_a_smaller_palette_png_within_the_psnr(tmp_path):
    path = _line_chart(tmp_path / "chart.png")
    original = _pixels(path)
    before = path.stat().st_size
    result = ci.compact_png(path)
    assert result.reason == "compacted" and result.changed
    assert result.before == before and result.after == path.stat().st_size < before / 2
    with Image.open(path) as image:
        assert image.mode == "P" and image.size == (original.shape[1], original.shape[0])
    assert ci.psnr(original, _pixels(path)) == pytest.approx(result.psnr) and result.psnr >= ci.DEFAULT_MIN_PSNR
    # a second pass finds a palette image and leaves it
    again = ci.compact_png(path)
    assert not again.changed and again.reason == "already a palette image"


def test_a_file_is_kept_byte_for_byte_where_the_palette_would_cost_detail(tmp_path):
    noise = np.random.default_rng(0).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)   # 4096 colours
    noisy = tmp_path / "noise.png"
    Image.fromarray(noise).save(noisy)
    chart = _line_chart(tmp_path / "chart.png")
    for path, min_psnr in ((noisy, ci.DEFAULT_MIN_PSNR), (chart, 200.0)):
        data = path.read_bytes()
        result = ci.compact_png(path, min_psnr=min_psnr)
        assert path.read_bytes() == data and not result.changed
        assert result.psnr is not None and result.psnr < min_psnr and "dB is below" in result.reason


def test_transparent_images_are_left_alone(tmp_path):
    rgba = np.full((16, 16, 4), 255, dtype=np.uint8)
    rgba[0, 0, 3] = 0
    path = tmp_path / "clear.png"
    Image.fromarray(rgba, "RGBA").save(path)
    data = path.read_bytes()
    result = ci.compact_png(path)
    assert path.read_bytes() == data and result.reason == "has transparent pixels" and result.psnr is None


def test_psnr_of_known_differences():
    a = np.zeros((4, 4, 3), dtype=np.uint8)
    assert ci.psnr(a, a) == math.inf
    assert ci.psnr(a, a + 1) == pytest.approx(20 * math.log10(255))   # an error of 1 in every channel
    with pytest.raises(ValueError, match="shape"):
        ci.psnr(a, a[:2])


@pytest.mark.parametrize("bad", [0, -3.0, math.nan, True, "40", None])
def test_a_bad_threshold_is_refused(tmp_path, bad):
    path = _line_chart(tmp_path / "chart.png")
    with pytest.raises(ValueError, match="min_psnr"):
        ci.compact_png(path, min_psnr=bad)
    with pytest.raises(ValueError, match="min_psnr"):
        ci.compact_folder(tmp_path, min_psnr=bad)


def test_missing_paths_and_other_formats_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        ci.compact_png(tmp_path / "absent.png")
    with pytest.raises(ValueError, match="no such folder"):
        ci.compact_folder(tmp_path / "absent")
    jpeg = tmp_path / "photo.png"
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(buffer, format="JPEG")
    jpeg.write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match="not a PNG"):
        ci.compact_png(jpeg)


def test_the_command_compacts_a_folder_and_says_how_much(tmp_path, capsys):
    _line_chart(tmp_path / "a.png")
    _line_chart(tmp_path / "b.png")
    (tmp_path / "notes.txt").write_text("not an image")
    assert ci.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compacted 2 of 2 PNGs:") and "of the bytes" in out
    assert ci.main([str(tmp_path / "absent")]) == 2
    assert "no such folder" in capsys.readouterr().err
