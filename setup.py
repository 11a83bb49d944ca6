"""The one build step pyproject.toml cannot state: compile the Open Inference Protocol's
gRPC service (serving_core/grpc/proto/grpc_predict_v2.proto) with grpc_tools.protoc
into the package, before its modules are collected.

It runs for a wheel, an sdist's build and ``pip install -e .`` alike (an editable
install runs build_py over the source tree), so the stubs are never committed and
always match the pinned grpcio-tools (pyproject's build-system requires).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = Path("serving_core/grpc/proto/grpc_predict_v2.proto")


def compile_proto() -> None:
    from grpc_tools import protoc  # a build requirement (pyproject.toml), not a runtime one

    include = Path(protoc.__file__).parent / "_proto"  # protobuf's own well-known types
    # The repository root as the include path: the generated _pb2_grpc imports its
    # _pb2 as serving_core.grpc.proto.grpc_predict_v2_pb2, not as a top-level module.
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={ROOT}",
        f"--pyi_out={ROOT}",
        f"--grpc_python_out={ROOT}",
        str(ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"grpc_tools.protoc could not compile {PROTO}")


class BuildPy(build_py):
    def run(self) -> None:
        compile_proto()
        super().run()


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import compile_proto
    setup(cmdclass={"build_py": BuildPy})
