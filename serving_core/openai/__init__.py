"""OpenAI's completions API (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``)
over a text generator, without a wire: what a request asks (``asked``), the objects
an answer is made of (``reply``) and the error shape (``errors``)."""
