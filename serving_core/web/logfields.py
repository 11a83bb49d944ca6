"""What the app leaves in a request's WSGI environ for its JSON access line, which
gunicorn writes after the app is done with it (``process.accesslog``). Imports no
Flask: the logger reads these keys in any process."""

from __future__ import annotations

# The route the app matched (absent: the request never reached the app).
ROUTE_KEY = "serving_core.route"
# The size of the batch that ran the request (absent: no model call, e.g. a cache hit).
BATCH_SIZE_KEY = "serving_core.batch_size"
# The trace id of the request's span (absent: traces off).
TRACE_ID_KEY = "serving_core.trace_id"
