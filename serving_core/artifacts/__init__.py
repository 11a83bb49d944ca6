"""The model's artifacts: SERVING_MODEL_URI fetched from its store into a verified local
directory, once, before the handler loads (docs/artifacts.md)."""
