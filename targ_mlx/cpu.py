"""What this CPU is: its feature flags and vendor, read from /proc/cpuinfo (the one reader)."""

from __future__ import annotations

from pathlib import Path


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # no such file (a Mac)
        return []


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo's "flags" on x86, "Features" on Arm); empty where
    there is no such file."""
    for line in _cpuinfo():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def intel() -> bool:
    return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in _cpuinfo())
