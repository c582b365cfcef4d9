"""The ResourceSlices NVIDIA's DRA driver publishes, in tests/helpers/dra/: up to v25.8
static MIG, from v25.12 DynamicMIG (shaped after the driver's code)."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

SHAPES = Path(__file__).parent / "dra"


@functools.cache
def dra_fixture(name: str) -> list[dict]:
    """The slices of one shape file (tests deep-copy before changing one)."""
    return list(yaml.safe_load_all((SHAPES / name).read_text()))
