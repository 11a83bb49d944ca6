"""gunicorn worker classes: gevent (the default) and gthread."""
