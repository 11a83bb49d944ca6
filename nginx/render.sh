#!/bin/sh
# Renders nginx's configuration for serving-core from environment variables.
#
#   render.sh OUT_DIR    writes OUT_DIR/nginx.conf (+ the snippets it includes);
#                        OUT_DIR also holds nginx's pid file and temp files.
#
# The container's entrypoint runs it before nginx starts, and the tests run it
# with the same variables, so what is tested is what ships.
#
# | variable                  | default    | effect                                              |
# | NGINX_UPSTREAM            | app:8000   | gunicorn: host:port or unix:/path/to.sock           |
# | NGINX_PORT                | 8080       | plain HTTP listener                                 |
# | NGINX_METRICS_PORT        | 9090       | the app's /metrics for Prometheus (keep it private) |
# | NGINX_LISTEN_ADDRESS      | (all)      | address to listen on, e.g. 127.0.0.1 (all ports)    |
# | SERVING_MAX_BODY_BYTES    | 1048576    | client_max_body_size (the app's own limit)          |
# | SERVING_REQUEST_TIMEOUT_S | 10         | proxy read/send timeout = this + the margin         |
# | NGINX_TIMEOUT_MARGIN_S    | 5          | how much longer nginx waits than the app's deadline |
# | SERVING_KEEPALIVE_S       | 5          | gunicorn's keep-alive; nginx drops idle upstream    |
# |                           |            | connections 1s before it (half of it if under 2s)   |
# | NGINX_UPSTREAM_KEEPALIVE  | 32         | idle upstream connections kept per nginx worker     |
# | NGINX_CLIENT_TIMEOUT_S    | 30         | client header/body/send timeouts (slow clients)     |
# | NGINX_CLIENT_BODY_BUFFER_SIZE | 128k   | bodies up to this stay in memory                    |
# | NGINX_WORKER_PROCESSES    | auto       | nginx workers                                       |
# | NGINX_WORKER_CONNECTIONS  | 1024       | connections per nginx worker                        |
# | NGINX_RATE_LIMIT_RPS      | 0 (off)    | requests/s per client address, then JSON 429        |
# | NGINX_RATE_LIMIT_BURST    | 20         | requests over the rate let through at once          |
# | NGINX_TRUSTED_PROXIES     | (none)     | CIDRs whose X-Forwarded-For names the real client   |
# | NGINX_TLS_CERT            | (none)     | PEM certificate chain; with NGINX_TLS_KEY turns TLS on |
# | NGINX_TLS_KEY             | (none)     | PEM private key                                     |
# | NGINX_TLS_PORT            | 8443       | TLS listener                                        |
# | NGINX_ACCESS_LOG          | /dev/stdout| JSON access log, one object per line                |
# | NGINX_LOG_LEVEL           | warn       | error_log level                                     |
set -eu

die() {
    echo "nginx/render.sh: $1" >&2
    exit 2
}

is_uint() { case $1 in '' | *[!0-9]*) return 1 ;; esac }
is_positive_number() {
    case $1 in '' | . | *[!0-9.]* | *.*.*) return 1 ;; esac
    awk -v v="$1" 'BEGIN { exit !(v > 0) }'
}
is_host() { case $1 in '' | *[!A-Za-z0-9.:\[\]-]*) return 1 ;; esac }
is_port() { is_uint "$1" && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]; }
check() {
    # check NAME VALUE PREDICATE "what it must be"
    "$3" "$2" || die "$1 must be $4, got '$2'"
}
seconds_to_ms() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 + 0.5 }'; }

[ $# -eq 1 ] || die "usage: render.sh OUT_DIR"
out=$1
templates=${NGINX_TEMPLATE_DIR:-$(dirname "$0")/templates}

NGINX_UPSTREAM=${NGINX_UPSTREAM:-app:8000}
NGINX_PORT=${NGINX_PORT:-8080}
NGINX_METRICS_PORT=${NGINX_METRICS_PORT:-9090}
NGINX_LISTEN_ADDRESS=${NGINX_LISTEN_ADDRESS:-}
SERVING_MAX_BODY_BYTES=${SERVING_MAX_BODY_BYTES:-1048576}
SERVING_REQUEST_TIMEOUT_S=${SERVING_REQUEST_TIMEOUT_S:-10}
NGINX_TIMEOUT_MARGIN_S=${NGINX_TIMEOUT_MARGIN_S:-5}
SERVING_KEEPALIVE_S=${SERVING_KEEPALIVE_S:-5}
NGINX_UPSTREAM_KEEPALIVE=${NGINX_UPSTREAM_KEEPALIVE:-32}
NGINX_CLIENT_TIMEOUT_S=${NGINX_CLIENT_TIMEOUT_S:-30}
NGINX_CLIENT_BODY_BUFFER_SIZE=${NGINX_CLIENT_BODY_BUFFER_SIZE:-128k}
NGINX_WORKER_PROCESSES=${NGINX_WORKER_PROCESSES:-auto}
NGINX_WORKER_CONNECTIONS=${NGINX_WORKER_CONNECTIONS:-1024}
NGINX_RATE_LIMIT_RPS=${NGINX_RATE_LIMIT_RPS:-0}
NGINX_RATE_LIMIT_BURST=${NGINX_RATE_LIMIT_BURST:-20}
NGINX_TRUSTED_PROXIES=${NGINX_TRUSTED_PROXIES:-}
NGINX_TLS_CERT=${NGINX_TLS_CERT:-}
NGINX_TLS_KEY=${NGINX_TLS_KEY:-}
NGINX_TLS_PORT=${NGINX_TLS_PORT:-8443}
NGINX_ACCESS_LOG=${NGINX_ACCESS_LOG:-/dev/stdout}
NGINX_LOG_LEVEL=${NGINX_LOG_LEVEL:-warn}

case $NGINX_UPSTREAM in
    *://*) die "NGINX_UPSTREAM is host:port or unix:/path (no scheme), got '$NGINX_UPSTREAM'" ;;
    unix:/*) case $NGINX_UPSTREAM in *[!A-Za-z0-9._/:-]*) die "NGINX_UPSTREAM has characters nginx cannot take: '$NGINX_UPSTREAM'" ;; esac ;;
    *:*) if ! is_host "${NGINX_UPSTREAM%:*}" || ! is_port "${NGINX_UPSTREAM##*:}"; then
        die "NGINX_UPSTREAM must be host:port or unix:/path, got '$NGINX_UPSTREAM'"
    fi ;;
    *) die "NGINX_UPSTREAM must be host:port or unix:/path, got '$NGINX_UPSTREAM'" ;;
esac
check NGINX_PORT "$NGINX_PORT" is_port "a port number (1-65535)"
check NGINX_METRICS_PORT "$NGINX_METRICS_PORT" is_port "a port number (1-65535)"
[ -z "$NGINX_LISTEN_ADDRESS" ] || check NGINX_LISTEN_ADDRESS "$NGINX_LISTEN_ADDRESS" is_host "an address or host name"
check SERVING_MAX_BODY_BYTES "$SERVING_MAX_BODY_BYTES" is_uint "a whole number of bytes"
[ "$SERVING_MAX_BODY_BYTES" -gt 0 ] || die "SERVING_MAX_BODY_BYTES must be above 0 (nginx reads 0 as no limit)"
check SERVING_REQUEST_TIMEOUT_S "$SERVING_REQUEST_TIMEOUT_S" is_positive_number "a positive number of seconds"
check NGINX_TIMEOUT_MARGIN_S "$NGINX_TIMEOUT_MARGIN_S" is_positive_number "a positive number of seconds"
case $SERVING_KEEPALIVE_S in 0 | 0.0) ;; *)
    check SERVING_KEEPALIVE_S "$SERVING_KEEPALIVE_S" is_positive_number "a number of seconds" ;;
esac
check NGINX_UPSTREAM_KEEPALIVE "$NGINX_UPSTREAM_KEEPALIVE" is_uint "a whole number"
[ "$NGINX_UPSTREAM_KEEPALIVE" -gt 0 ] || die "NGINX_UPSTREAM_KEEPALIVE must be above 0"
check NGINX_CLIENT_TIMEOUT_S "$NGINX_CLIENT_TIMEOUT_S" is_uint "a whole number of seconds"
case $NGINX_CLIENT_BODY_BUFFER_SIZE in
    '' | *[!0-9kKmM]* | [kKmM]* | *[kKmM]?*) die "NGINX_CLIENT_BODY_BUFFER_SIZE must be bytes or a size like 128k or 1m, got '$NGINX_CLIENT_BODY_BUFFER_SIZE'" ;;
esac
[ "$NGINX_WORKER_PROCESSES" = auto ] || check NGINX_WORKER_PROCESSES "$NGINX_WORKER_PROCESSES" is_uint "auto or a whole number"
check NGINX_WORKER_CONNECTIONS "$NGINX_WORKER_CONNECTIONS" is_uint "a whole number"
check NGINX_RATE_LIMIT_RPS "$NGINX_RATE_LIMIT_RPS" is_uint "a whole number (0 turns the limit off)"
check NGINX_RATE_LIMIT_BURST "$NGINX_RATE_LIMIT_BURST" is_uint "a whole number"
check NGINX_TLS_PORT "$NGINX_TLS_PORT" is_port "a port number (1-65535)"
case $NGINX_LOG_LEVEL in
    debug | info | notice | warn | error | crit | alert | emerg) ;;
    *) die "NGINX_LOG_LEVEL must be one of debug info notice warn error crit alert emerg, got '$NGINX_LOG_LEVEL'" ;;
esac
case $NGINX_ACCESS_LOG in
    /*) case $NGINX_ACCESS_LOG in *[!A-Za-z0-9._/-]*) die "NGINX_ACCESS_LOG has characters nginx cannot take: '$NGINX_ACCESS_LOG'" ;; esac ;;
    *) die "NGINX_ACCESS_LOG must be an absolute path (/dev/stdout for the container log), got '$NGINX_ACCESS_LOG'" ;;
esac
if [ -n "$NGINX_TLS_CERT$NGINX_TLS_KEY" ]; then
    [ -n "$NGINX_TLS_CERT" ] || die "NGINX_TLS_KEY is set but NGINX_TLS_CERT is not; TLS needs both"
    [ -n "$NGINX_TLS_KEY" ] || die "NGINX_TLS_CERT is set but NGINX_TLS_KEY is not; TLS needs both"
    [ -r "$NGINX_TLS_CERT" ] || die "NGINX_TLS_CERT names a file that cannot be read: '$NGINX_TLS_CERT'"
    [ -r "$NGINX_TLS_KEY" ] || die "NGINX_TLS_KEY names a file that cannot be read: '$NGINX_TLS_KEY'"
fi
trusted_proxies=$(echo "$NGINX_TRUSTED_PROXIES" | tr ',' ' ')
for cidr in $trusted_proxies; do
    case $cidr in *[!0-9A-Fa-f.:/]*) die "NGINX_TRUSTED_PROXIES holds '$cidr', which is not an address or CIDR" ;; esac
done

# Derived values: timeouts in milliseconds, so fractional seconds survive.
NGINX_CLIENT_MAX_BODY_SIZE=$SERVING_MAX_BODY_BYTES
NGINX_LIMIT_REQ_BURST= # nginx refuses burst=0; no burst is the same thing
[ "$NGINX_RATE_LIMIT_BURST" -eq 0 ] || NGINX_LIMIT_REQ_BURST=" burst=$NGINX_RATE_LIMIT_BURST nodelay"
NGINX_PROXY_TIMEOUT=$(seconds_to_ms "$(awk -v a="$SERVING_REQUEST_TIMEOUT_S" -v b="$NGINX_TIMEOUT_MARGIN_S" 'BEGIN { print a + b }')")ms
NGINX_UPSTREAM_KEEPALIVE_TIMEOUT=$(awk -v k="$SERVING_KEEPALIVE_S" 'BEGIN {
    ms = k * 1000 - 1000; if (ms < k * 500) ms = k * 500; if (ms < 1) ms = 1; printf "%dms", ms }')
case $NGINX_LISTEN_ADDRESS in
    '') listen_on= ;;
    \[*) listen_on="$NGINX_LISTEN_ADDRESS:" ;;
    *:*) listen_on="[$NGINX_LISTEN_ADDRESS]:" ;; # a bare IPv6 address
    *) listen_on="$NGINX_LISTEN_ADDRESS:" ;;
esac
NGINX_LISTEN=$listen_on$NGINX_PORT
NGINX_TLS_LISTEN=$listen_on$NGINX_TLS_PORT
NGINX_METRICS_LISTEN=$listen_on$NGINX_METRICS_PORT
NGINX_CONF_DIR=$(mkdir -p "$out" && cd "$out" && pwd)

export NGINX_UPSTREAM NGINX_LISTEN NGINX_TLS_LISTEN NGINX_METRICS_LISTEN SERVING_MAX_BODY_BYTES NGINX_UPSTREAM_KEEPALIVE \
    NGINX_CLIENT_TIMEOUT_S NGINX_CLIENT_BODY_BUFFER_SIZE NGINX_WORKER_PROCESSES \
    NGINX_WORKER_CONNECTIONS NGINX_RATE_LIMIT_RPS NGINX_LIMIT_REQ_BURST NGINX_TLS_CERT \
    NGINX_TLS_KEY NGINX_ACCESS_LOG NGINX_LOG_LEVEL NGINX_CLIENT_MAX_BODY_SIZE \
    NGINX_PROXY_TIMEOUT NGINX_UPSTREAM_KEEPALIVE_TIMEOUT NGINX_CONF_DIR

# Only these names are substituted; nginx's own $variables pass through.
# shellcheck disable=SC2016 # the list is envsubst's, not the shell's, to expand
names='${NGINX_UPSTREAM} ${NGINX_LISTEN} ${NGINX_TLS_LISTEN} ${NGINX_METRICS_LISTEN} ${SERVING_MAX_BODY_BYTES} ${NGINX_UPSTREAM_KEEPALIVE}
${NGINX_CLIENT_TIMEOUT_S} ${NGINX_CLIENT_BODY_BUFFER_SIZE} ${NGINX_WORKER_PROCESSES}
${NGINX_WORKER_CONNECTIONS} ${NGINX_RATE_LIMIT_RPS} ${NGINX_LIMIT_REQ_BURST} ${NGINX_TLS_CERT}
${NGINX_TLS_KEY} ${NGINX_ACCESS_LOG} ${NGINX_LOG_LEVEL}
${NGINX_CLIENT_MAX_BODY_SIZE} ${NGINX_PROXY_TIMEOUT} ${NGINX_UPSTREAM_KEEPALIVE_TIMEOUT}
${NGINX_CONF_DIR}'

render() { envsubst "$names" <"$templates/$1.template" >"$NGINX_CONF_DIR/$1"; }
off() { echo "# off: $2" >"$NGINX_CONF_DIR/$1"; }

render nginx.conf
if [ "$NGINX_RATE_LIMIT_RPS" -gt 0 ]; then
    render rate-limit-zone.conf
    render rate-limit.conf
else
    off rate-limit-zone.conf "NGINX_RATE_LIMIT_RPS is 0"
    off rate-limit.conf "NGINX_RATE_LIMIT_RPS is 0"
fi
if [ -n "$NGINX_TLS_CERT" ]; then
    render tls.conf
else
    off tls.conf "NGINX_TLS_CERT and NGINX_TLS_KEY are not set"
fi
if [ -n "$NGINX_TRUSTED_PROXIES" ]; then
    {
        for cidr in $trusted_proxies; do
            echo "set_real_ip_from $cidr;"
        done
        echo "real_ip_header X-Forwarded-For;"
        echo "real_ip_recursive on;"
    } >"$NGINX_CONF_DIR/real-ip.conf"
else
    off real-ip.conf "NGINX_TRUSTED_PROXIES is not set; the client is the peer address"
fi
