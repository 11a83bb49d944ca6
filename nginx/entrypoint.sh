#!/bin/sh
# The nginx container's entrypoint: render the configuration from the
# environment into /tmp/nginx (writable even on a read-only root filesystem),
# then run the command, nginx by default, as PID 1.
set -eu
"$(dirname "$0")/render.sh" /tmp/nginx
exec "$@"
