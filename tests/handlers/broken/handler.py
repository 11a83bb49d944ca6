"""A handler whose setup() fails, as when the model file is missing."""

from serving_core import Handler


class Broken(Handler):
    def setup(self) -> None:
        raise FileNotFoundError("model.safetensors not found in /models/broken")

    def predict(self, params: dict) -> dict:
        return params
