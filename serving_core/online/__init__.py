"""One worker's request path without Flask: admission, deadlines and the model runner."""
