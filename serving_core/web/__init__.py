"""The HTTP layer (Flask): the app and its routes (``/predict``, ``/jobs``, V2), the front
door's Flask side, params, who may call (keys, CORS), OpenAPI and the docs page."""
