"""serving-core: serve one ``handler.py`` with batching, backpressure and gunicorn preload."""

from .app import create_app as create_app
from .handler import Handler as Handler
from .handler import InvalidInput as InvalidInput
from .settings import Settings as Settings

__all__ = ["Handler", "InvalidInput", "Settings", "create_app"]
