"""Fetch the JavaScript the book serves itself (require.js and the Jupyter widget manager) at set-up time.

    python tools/fetch_book_js.py book/js-packages.txt .venv/share/book-js

Each line of the pins file names a folder, an npm ``package@version`` and its integrity. ``npm pack``
downloads that version's own tarball (none of its dependencies: the widget manager's ``dist/embed-amd.js``
is a self-contained bundle), the tarball's sha512 is checked against the pin, and it is unpacked into
``DEST/<folder>``. A ``.stamp`` file is written when every package is in place.

Without npm, or when a download or check fails, nothing is left half done: DEST is removed, the reason is
printed, and the exit status is 0, because the book still builds: book/_ext/local_widgets.py then points
the pages at a CDN and says so in the build log.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

FALLBACK = "the book will load require.js and the widget manager from a CDN (they need a network there)"


@dataclass(frozen=True)
class Pin:
    folder: str
    spec: str         # package@version, as npm takes it
    integrity: str    # "sha512-<base64>", npm's dist.integrity


class FetchError(RuntimeError):
    pass


def read_pins(path: Path) -> list[Pin]:
    pins = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 3 or not words[2].startswith("sha512-") or "@" not in words[1][1:]:
            raise FetchError(f"{path}:{number}: expected 'folder package@version sha512-...', got {line!r}")
        pins.append(Pin(*words))
    return pins


def integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def unpack(tarball: Path, pin: Pin, dest: Path) -> Path:
    """Check ``tarball`` against ``pin`` and unpack its ``package/`` folder into ``dest/<folder>``."""
    found = integrity(tarball)
    if found != pin.integrity:
        raise FetchError(f"{pin.spec}: the downloaded tarball's integrity is {found}, the pin says {pin.integrity}")
    target = dest / pin.folder
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            name = Path(member.name)
            if not name.parts or name.parts[0] != "package" or ".." in name.parts or not (member.isfile() or member.isdir()):
                continue
            out = target.joinpath(*name.parts[1:])
            if member.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None
            with source, open(out, "wb") as sink:
                shutil.copyfileobj(source, sink)
    return target


def npm_pack(spec: str, folder: Path, npm: str) -> Path:
    result = subprocess.run([npm, "pack", "--loglevel=error", "--pack-destination", str(folder), spec],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise FetchError(f"npm pack {spec} failed: {(result.stderr or result.stdout).strip()[-500:]}")
    name = result.stdout.strip().splitlines()[-1]
    return folder / name


def fetch(pins_file: Path, dest: Path, npm: str | None = None) -> list[Path]:
    npm = npm or shutil.which("npm")
    if npm is None:
        raise FetchError("npm not found")
    pins = read_pins(pins_file)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory() as packs:
            folders = [unpack(npm_pack(pin.spec, Path(packs), npm), pin, dest) for pin in pins]
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    (dest / ".stamp").write_text("".join(f"{pin.spec} {pin.integrity}\n" for pin in pins))
    return folders


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    pins_file, dest = Path(argv[0]), Path(argv[1])
    try:
        folders = fetch(pins_file, dest)
    except (FetchError, OSError, subprocess.SubprocessError) as error:
        print(f"book JavaScript NOT fetched ({error}): {FALLBACK}")
        return 0
    for folder in folders:
        print(f"book JavaScript: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
