"""gunicorn's worker classes: gevent (``green``, the default, with ``greenfuture``,
``fairaccept``, ``clientwatch`` and ``uploads``) and ``gthread``."""
