"""What the image carries: deploy/Dockerfile copies the product and nothing else, the
build context (.dockerignore) sends nothing else, and the product installed from it runs
without the simulator, which it never imports. (No container engine runs here: the
image's Python install step is the same ``pip`` build, made from the same files.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = "numaguard"  # the folder the image is built from, less its simulator
SIMULATOR = "numaguard/simulator"


def copied() -> set[str]:
    """What the Dockerfile's build stage copies from the context."""
    text = (ROOT / "deploy/Dockerfile").read_text()
    sources = set()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources.update(line.split()[1:-1])
    return sources


def ignore_lines() -> list[str]:
    return [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def sent() -> set[str]:
    """What .dockerignore lets into the build context: it ignores everything but these."""
    lines = ignore_lines()
    assert lines[0] == "*"
    return {line[1:] for line in lines if line.startswith("!")}


def held_back() -> set[str]:
    """What .dockerignore ignores again inside what it let in."""
    return {line for line in ignore_lines()[1:] if not line.startswith(("!", "**"))}


def test_the_image_gets_the_product_and_no_more():
    assert copied() == sent() == {"pyproject.toml", "README.md", PRODUCT}
    assert held_back() == {SIMULATOR}


def test_the_product_built_as_the_image_builds_it_runs_without_the_simulator(tmp_path):
    context = tmp_path / "context"
    context.mkdir()
    for name in sent():
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, context / name)
    for name in held_back():
        shutil.rmtree(context / name)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    build += ["--no-build-isolation", "--wheel-dir", str(wheels), str(context)]
    subprocess.run(build, check=True, capture_output=True)
    (wheel,) = wheels.glob("numaguard-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "installed")
    # one top-level package, numaguard; no simulator in it
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"numaguard"}
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    assert {p for p in packages if p.count("/") == 1} == {
        "numaguard/common",
        "numaguard/contract",
        "numaguard/exporter",
        "numaguard/remediator",
    }
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = (tmp_path / "installed" / entry_points).read_text()
    assert re.search(r"^numaguard-exporter = numaguard.exporter.cli:main$", scripts, re.M)
    assert re.search(r"^numaguard-remediator = numaguard.remediator.cli:main$", scripts, re.M)
    helper = r"^numaguard-memory-mover = numaguard.exporter.mover.helper:main$"
    assert re.search(helper, scripts, re.M)

    # every product module imports, and every command answers --help, from the wheel's
    # files alone, with the simulator (and the rest of this repository) unimportable;
    # the exporter without the remediator's extra, which the remediator asks for by name
    probe = f"""
import importlib, pkgutil, sys
OUTSIDE = {{"tests", "bench", "alerts", "grafana", "deploy"}}
EXTRA = {{"pandas", "numpy", "kubernetes", "promql_parser"}}
blocked = OUTSIDE | EXTRA
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked or name.startswith("numaguard.simulator"):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Absent())
sys.path.insert(0, {str(tmp_path / "installed")!r})

def every_module(package):
    root = importlib.import_module(package)
    assert root.__file__.startswith({str(tmp_path / "installed")!r}), root.__file__
    for module in pkgutil.walk_packages(root.__path__, package + "."):
        # __main__ runs a command; api_pb2_grpc is grpcio's, for the test kubelet only
        if not module.name.endswith((".__main__", ".api_pb2_grpc")):
            importlib.import_module(module.name)

def answers_help(main):
    try:
        main(["--help"])
    except SystemExit as done:
        assert done.code == 0, done.code

every_module("numaguard.contract")
every_module("numaguard.common")
every_module("numaguard.exporter")
from numaguard.exporter import cli as exporter_cli
answers_help(exporter_cli.main)
from numaguard.exporter.mover import helper
answers_help(helper.main)
try:
    import numaguard.remediator
except ImportError as err:
    assert "pip install 'numaguard[remediator]'" in str(err), err
else:
    raise AssertionError("the remediator imported without its extra")
blocked = OUTSIDE
every_module("numaguard.remediator")
from numaguard.remediator import cli as remediator_cli
answers_help(remediator_cli.main)
print("ok")
"""
    run = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1] == "ok"
    assert "usage: numaguard-exporter" in run.stdout
    assert "usage: numaguard-memory-mover" in run.stdout
    assert "usage: numaguard-remediator" in run.stdout
