"""How both commands' --help shows defaults: where there is one to show (not None, an
empty string or a switch's False), and byte counts in binary units."""

from __future__ import annotations

import argparse


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text, default = action.help or "", action.default
        if default is None or default == "" or isinstance(default, bool) or "%(default)" in text:
            return text
        if action.metavar == "BYTES" and isinstance(default, int):
            return f"{text} (default: {binary(default)})"
        return super()._get_help_string(action)


def binary(count: int) -> str:
    """64 MiB for 67108864; a count no unit divides stays as it is."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return str(count)
