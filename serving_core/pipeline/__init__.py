"""Pipelines: a handler whose stages are other services, read from ``pipeline.yaml``."""
