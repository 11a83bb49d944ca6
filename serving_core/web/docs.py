"""The API docs page: Swagger UI over ``/openapi.json``, from files that pip installed.

The assets come from the ``flask-swagger-ui`` wheel (its ``dist/`` is Swagger
UI's own release, whose version the wheel's carries), never from a CDN, so the
page works offline and inside a cluster. Only the page and the few files it
loads are served. Every URL on the page is relative (``docs/…``,
``openapi.json``), so it also works behind a proxy that mounts the API under a
prefix.
"""

from __future__ import annotations

import html
from importlib.resources import files
from pathlib import Path

ASSETS = frozenset(
    {"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "favicon-16x16.png"}
)

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{title} - API docs</title>
  <link rel="stylesheet" href="docs/swagger-ui.css">
  <link rel="icon" type="image/png" href="docs/favicon-32x32.png" sizes="32x32">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({{
      url: "openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      presets: [SwaggerUIBundle.presets.apis],
      layout: "BaseLayout",
      // No "validator.swagger.io" badge: it would send the document off-site.
      validatorUrl: null
    }});
  </script>
</body>
</html>
"""


def page(title: str) -> str:
    """The HTML of ``GET /docs`` for a service named ``title``."""
    return _PAGE.format(title=html.escape(title))


def assets_dir() -> Path:
    """The folder of Swagger UI's files inside the installed ``flask-swagger-ui``."""
    return Path(str(files("flask_swagger_ui") / "dist"))
