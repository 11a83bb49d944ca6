"""Stream serving: records from a broker, results to a broker (``serving-core stream``).

``base`` holds the two ends as a stream consumer sees them; one module per
broker implements them (``redis_streams`` with ``redis_replies``, ``amqp`` with
``amqp_connection``), and ``brokers`` opens the right one from a URL's scheme.
Imports no Flask, no gunicorn.
"""
