"""The Open Inference Protocol (V2) over gRPC: KServe's ``GRPCInferenceService``, with
grpc.health.v1 and reflection, served by each gthread worker beside gunicorn.

The only package that imports grpcio and protobuf (an import-linter contract).
Its stubs (``proto/``) are compiled from the vendored .proto at install (setup.py).
"""
