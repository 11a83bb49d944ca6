"""The smallest handler: answers with the parameters it was given."""

from serving_core import Handler


class Echo(Handler):
    def predict(self, params: dict) -> dict:
        return {"echo": params}
