"""Regenerate the PodResources modules from api.proto (``make proto``)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
PACKAGE_DIR = "exporter/sources/podresources"


def generate(out_dir: str) -> None:
    """Write api_pb2.py, api_pb2.pyi and api_pb2_grpc.py for api.proto under ``out_dir``."""
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


if __name__ == "__main__":
    generate(sys.argv[1] if len(sys.argv) > 1 else str(HERE.parent.parent.parent))
