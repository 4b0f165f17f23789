"""Sizes and durations as options and object names spell them: 16G, 512M, 24h, 7d."""

from __future__ import annotations

import re

from ckptfs.common.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, option: str = "size") -> int:
    """'512M', '16G', '1.5T', '4096' -> bytes (binary units); ConfigError if malformed."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGTB]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise ConfigError(f"invalid value {text!r} for {option} (use e.g. 512M, 16G, 1T)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(n: int) -> str:
    """Bytes as parse_size reads them, in the largest binary unit that is exact: 16G,
    256M, 512K, or plain bytes."""
    for unit in "TGMK":
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
#: the longest duration an option takes, in seconds: 100 years (36500d); a longer one is a
#: typo, and its cutoff would lie before year 1
MAX_DURATION = 36500 * 86400


def parse_duration(text: str, option: str = "duration") -> float:
    """'30s', '15m', '24h', '7d', '0', '90' (seconds) -> seconds; ConfigError if malformed,
    negative or over MAX_DURATION."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if not m:
        raise ConfigError(f"invalid value {text!r} for {option}: want a duration of 0 or "
                          f"more, e.g. 30s, 15m, 24h, 7d or 0")
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if seconds > MAX_DURATION:
        raise ConfigError(f"invalid value {text!r} for {option}: at most 36500d (100 "
                          f"years)")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as parse_duration reads them, in the largest unit that is exact: 86400 ->
    '24h' (hours up to 48), 604800 -> '7d', 90 -> '90s'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0 and not (unit == "d" and seconds <= 172800):
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
