"""Regenerate gRPC modules from an api.proto (``make proto``): this package's
PodResources API by default, or those of the folders given (the simulator's device
plugin API is made the same way)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[3]  # the checkout: folders are import paths from here
MODULES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def package_dir(folder: Path) -> str:
    """Where protoc is told the package lives: the import path of the modules it writes."""
    return folder.resolve().relative_to(ROOT).as_posix()


def generate(out_dir: str, folder: Path = HERE) -> None:
    """Write api_pb2.py, api_pb2.pyi and api_pb2_grpc.py for ``folder``/api.proto under
    ``out_dir``/package_dir(folder)."""
    from grpc_tools import protoc  # a build-time tool, in the test extras

    code = protoc.main(
        [
            "protoc",
            f"-I{package_dir(folder)}={folder}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(folder / "api.proto"),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed with code {code}")


def regenerate(folder: Path = HERE) -> None:
    """Generate into a temporary tree and put the modules beside api.proto."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, folder)
        for name in MODULES:
            shutil.copy(Path(tmp) / package_dir(folder) / name, folder / name)


if __name__ == "__main__":
    for folder in sys.argv[1:] or [HERE]:
        regenerate(Path(folder))
