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
    private_pool(ROOT / PROTO.with_name(PROTO.stem + "_pb2.py"))
    stub = ROOT / PROTO.with_name(PROTO.stem + "_pb2.pyi")
    declared = "DESCRIPTOR: _descriptor.FileDescriptor\n"
    pool = "from google.protobuf import descriptor_pool as _descriptor_pool\n"
    pool += "POOL: _descriptor_pool.DescriptorPool\n"
    stub.write_text(stub.read_text().replace(declared, declared + pool, 1))


DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("


def private_pool(module: Path) -> None:
    """Register the generated messages in a pool of their own (``POOL``), not protobuf's
    process-wide default one.

    Every copy of the V2 proto declares the same ``inference.*`` messages: tritonclient's
    ``grpc_service.proto``, kserve's ``grpc_predict_v2.proto``, ours. The default pool
    refuses a symbol that another file already declared, so whichever is imported second
    fails (``TypeError: duplicate symbol 'inference.ServerLiveRequest'``): a handler that
    calls Triton with tritonclient.grpc could not run beside our gRPC front. protoc has
    no option for another pool, so the one call that names the default is rewritten;
    the messages, the wire format and the service's name are unchanged.
    """
    text = module.read_text()
    if text.count(DEFAULT_POOL) != 1:
        raise SystemExit(
            f"{module}: expected one {DEFAULT_POOL!r} in protoc's output; grpcio-tools "
            "changed its generated code, so update setup.py's private_pool"
        )
    text = text.replace(DEFAULT_POOL, "POOL.AddSerializedFile(")
    text = text.replace(
        "_sym_db = _symbol_database.Default()\n",
        "_sym_db = _symbol_database.Default()\n"
        "POOL = _descriptor_pool.DescriptorPool()  # setup.py's private_pool says why\n",
        1,
    )
    module.write_text(text)


class BuildPy(build_py):
    def run(self) -> None:
        compile_proto()
        super().run()


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import compile_proto
    setup(cmdclass={"build_py": BuildPy})
