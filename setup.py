"""The one import namespace, ``numaguard``, over the repository's component folders:
``exporter/`` is ``numaguard.exporter`` and so on (metadata: pyproject.toml). A folder
the build context lacks (the image's has no simulator) is left out, not an error."""

from pathlib import Path

from setuptools import find_packages, setup

COMPONENTS = ("exporter", "remediator", "simulator")
here = Path(__file__).resolve().parent
present = [c for c in COMPONENTS if (here / c / "__init__.py").is_file()]
setup(
    package_dir={"numaguard": "numaguard", **{f"numaguard.{c}": c for c in present}},
    packages=[
        "numaguard",
        *(f"numaguard.{p}" for c in present for p in find_packages(include=[c, f"{c}.*"])),
    ],
)
