"""Stream serving: records from a broker, results to a broker (``serving-core stream``).

``base`` holds the two ends as the stream worker sees them; one module per
broker implements them (``redis_streams``, ``amqp``), and ``backend`` opens the
right one from a URL's scheme. Imports no Flask, no gunicorn.
"""
