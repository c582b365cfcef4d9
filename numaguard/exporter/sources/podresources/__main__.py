"""Regenerate the PodResources modules from api.proto (``make proto``)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
# where protoc is told the package lives: the import path of the modules it writes
PACKAGE_DIR = "numaguard/exporter/sources/podresources"
MODULES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: str) -> None:
    """Write api_pb2.py, api_pb2.pyi and api_pb2_grpc.py for api.proto under
    ``out_dir``/PACKAGE_DIR."""
    from grpc_tools import protoc  # a build-time tool, in the test extras

    code = protoc.main(
        [
            "protoc",
            f"-I{PACKAGE_DIR}={HERE}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(HERE / "api.proto"),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed with code {code}")


def regenerate() -> None:
    """Generate into a temporary tree and put the modules here."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        for name in MODULES:
            shutil.copy(Path(tmp) / PACKAGE_DIR / name, HERE / name)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        generate(sys.argv[1])
    else:
        regenerate()
