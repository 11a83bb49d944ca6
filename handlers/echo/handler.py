"""The smallest handler: answers with the parameters it was given."""

from typing import Any

from serving_core import Handler


class Echo(Handler):
    def predict(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"echo": params}
