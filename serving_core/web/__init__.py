"""The HTTP layer (Flask): app and routes, params, access (keys, CORS), OpenAPI, docs page."""
