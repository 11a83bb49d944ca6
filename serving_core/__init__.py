"""serving-core: serve one ``handler.py`` with batching, backpressure and gunicorn preload.

The package's face is the handler contract and the settings. Importing it loads
no Flask: a handler module, ``serving-core healthcheck`` (the pods' exec probe)
and the batch and queue tools stay light. The web app is ``serving_core.web.app``.
"""

from serving_core.generation import Final as Final
from serving_core.generation import Generation as Generation
from serving_core.generation import TextGeneration as TextGeneration
from serving_core.handler import Handler as Handler
from serving_core.handler import InvalidInput as InvalidInput
from serving_core.handler import Tensor as Tensor
from serving_core.handler import Tensors as Tensors
from serving_core.settings import Settings as Settings


def __getattr__(name: str) -> str:
    # Looked up when asked: importlib.metadata costs more than the rest of this import.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("serving-core")
        except PackageNotFoundError:  # a checkout that was never installed
            return "0.0.0"
    raise AttributeError(f"module 'serving_core' has no attribute {name!r}")


__all__ = [
    "Final",
    "Generation",
    "Handler",
    "InvalidInput",
    "Settings",
    "Tensor",
    "Tensors",
    "TextGeneration",
    "__version__",
]
