"""serving-core: serve one ``handler.py`` with batching, backpressure and gunicorn preload."""

from importlib.metadata import PackageNotFoundError, version

from .app import create_app as create_app
from .handler import Handler as Handler
from .handler import InvalidInput as InvalidInput
from .settings import Settings as Settings

try:
    __version__ = version("serving-core")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0.0.0"

__all__ = ["Handler", "InvalidInput", "Settings", "__version__", "create_app"]
