"""One worker's request path without Flask: the front door, admission, deadlines, the
model runner and ``/jobs``."""
