#!/bin/sh
# serving-core-nginx's entrypoint: checks the settings, renders the templates,
# then runs the command (nginx, as the image's CMD says).
#
#   entrypoint.sh nginx -c /tmp/nginx/nginx.conf -e stderr -g 'daemon off;'
#   entrypoint.sh true      # check and render only (what the tests do)
#
# Ours, not the base image's /docker-entrypoint.sh, so that it works on any
# nginx base (the official alpine one or Debian's nginx) and the tests run
# exactly what the container runs (nginx/Dockerfile says more).
#
# 1. Every setting below is checked; a bad value stops here, before nginx
#    starts, with exit status 2 and a message naming the variable and what it
#    accepts. Defaults are filled in and the derived values computed.
# 2. Every *.template under NGINX_ENVSUBST_TEMPLATE_DIR (/etc/nginx/templates)
#    is rendered with envsubst to the same name, less the suffix, under
#    NGINX_ENVSUBST_OUTPUT_DIR (/tmp/nginx). Only NGINX_* and SERVING_* names
#    are filled in, so nginx's own variables ($request_id, $status ...) reach
#    nginx as written.
# 3. exec "$@": nginx replaces this shell, so it gets the container's signals.
#
# | variable                  | default    | effect                                              |
# | NGINX_UPSTREAM            | app:8000   | gunicorn: host:port or unix:/path/to.sock           |
# | NGINX_PORT                | 8080       | plain HTTP listener                                 |
# | NGINX_METRICS_PORT        | 9090       | the app's /metrics for Prometheus (keep it private) |
# | NGINX_LISTEN_ADDRESS      | (all)      | address to listen on, e.g. 127.0.0.1 (the ports     |
# |                           |            | above and NGINX_TLS_PORT)                           |
# | NGINX_GRPC_PORT           | 0 (off)    | HTTP/2 cleartext (h2c) listener proxying gRPC to    |
# |                           |            | NGINX_GRPC_UPSTREAM, errors as gRPC statuses        |
# | NGINX_GRPC_UPSTREAM       | (none)     | the app's SERVING_GRPC_PORT: host:port or           |
# |                           |            | unix:/path; needed when NGINX_GRPC_PORT is set      |
# | NGINX_STATUS_PORT         | 0 (off)    | stub_status (nginx's connection and request counts) |
# |                           |            | at /stub_status on 127.0.0.1 only, for              |
# |                           |            | nginx-prometheus-exporter beside nginx              |
# | SERVING_MAX_BODY_BYTES    | 1048576    | client_max_body_size (the app's own limit)          |
# | SERVING_REQUEST_TIMEOUT_S | 10         | proxy read/send timeout = this + the margin         |
# | SERVING_GENERATION_TIMEOUT_S | 0       | a generating handler's: its one-piece answer may    |
# |                           |            | take this long, so the timeouts are the longer of   |
# |                           |            | the two + the margin; 0: the app does not generate  |
# | NGINX_TIMEOUT_MARGIN_S    | 5          | how much longer nginx waits than the app's deadline |
# | SERVING_KEEPALIVE_S       | 5          | gunicorn's keep-alive; nginx drops idle upstream    |
# |                           |            | connections 1s before it (half of it if under 2s);  |
# |                           |            | 0 keeps no idle upstream connections                |
# | NGINX_UPSTREAM_KEEPALIVE  | 32         | idle upstream connections kept per nginx worker     |
# | NGINX_UPSTREAM_MAX_CONNS  | 0 (off)    | requests in the app at once, all nginx workers      |
# |                           |            | together; beyond it a fast JSON 503 from nginx.     |
# |                           |            | Set it to what the app can hold: SERVING_WORKERS x  |
# |                           |            | (SERVING_MAX_QUEUE + SERVING_MAX_BATCH_SIZE)        |
# | NGINX_CLIENT_TIMEOUT_S    | 10         | client header/body/send timeouts (slow clients)     |
# | NGINX_KEEPALIVE_TIMEOUT_S | 15         | idle client keep-alive connections are closed after |
# | NGINX_CONN_LIMIT_PER_CLIENT | 128      | requests in progress per client address (a slow     |
# |                           |            | body upload counts), then JSON 429; 0 = off         |
# | NGINX_CLIENT_BODY_BUFFER_SIZE | 128k   | bodies up to this stay in memory                    |
# | NGINX_BODY_SPOOL_BYTES    | 128m       | request bodies spooled to the temp directory at     |
# |                           |            | once, all clients together (bytes, or 128k, 128m,   |
# |                           |            | 1g): this / SERVING_MAX_BODY_BYTES uploads over the |
# |                           |            | body buffer at a time (at least 1), then JSON 429;  |
# |                           |            | keep it under the size of /tmp; 0 = off             |
# | NGINX_WORKER_PROCESSES    | auto       | nginx workers                                       |
# | NGINX_WORKER_CONNECTIONS  | 1024       | connections per nginx worker (each may buffer a     |
# |                           |            | body of NGINX_CLIENT_BODY_BUFFER_SIZE in memory, or |
# |                           |            | up to SERVING_MAX_BODY_BYTES in the temp directory: |
# |                           |            | size it, and the body buffer, to the container's    |
# |                           |            | memory and /tmp limits); open files: twice this     |
# | NGINX_RATE_LIMIT_RPS      | 0 (off)    | requests/s per client address, then JSON 429        |
# | NGINX_RATE_LIMIT_BURST    | 20         | requests over the rate let through at once          |
# | NGINX_TRUSTED_PROXIES     | (none)     | CIDRs whose X-Forwarded-For names the real client   |
# | NGINX_TLS_CERT            | (none)     | PEM certificate chain; with NGINX_TLS_KEY turns TLS on |
# | NGINX_TLS_KEY             | (none)     | PEM private key                                     |
# | NGINX_TLS_PORT            | 8443       | TLS listener                                        |
# | NGINX_ACCESS_LOG          | /dev/stdout| JSON access log, one object per line (kube-probe    |
# |                           |            | requests are left out)                              |
# | NGINX_LOG_LEVEL           | warn       | error_log level                                     |
# | NGINX_ENVSUBST_OUTPUT_DIR | /tmp/nginx | the rendered config, nginx's pid and temp files     |
# | NGINX_ENVSUBST_TEMPLATE_DIR | /etc/nginx/ | the *.template files to render (the tests |
# |                           | templates  | point it at nginx/templates)                        |
#
# Needs sh, awk, find, sort, tr, id, mkdir and envsubst besides nginx; every
# name it defines for itself is lower case, so only the settings above and
# the derived NGINX_* values reach the templates.

set -eu

die() {
    echo "serving-core-nginx: $1" >&2
    exit 2
}
is_uint() { case $1 in '' | *[!0-9]*) return 1 ;; esac }
is_positive_number() {
    case $1 in '' | . | *[!0-9.]* | *.*.*) return 1 ;; esac
    awk -v v="$1" 'BEGIN { exit !(v > 0) }'
}
is_host() { case $1 in '' | *[!A-Za-z0-9.:\[\]-]*) return 1 ;; esac }
is_port() {
    is_uint "$1" && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]
}
is_path() { case $1 in /*) case $1 in *[!A-Za-z0-9._/-]*) return 1 ;; esac ;; *) return 1 ;; esac }
check() {
    # check NAME VALUE PREDICATE "what it must be"
    "$3" "$2" || die "$1 must be $4, got '$2'"
}
ms() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 + 0.5 }'; }
# nginx's size syntax (bytes, or a k, m or g suffix), checked before, in bytes.
bytes_of() {
    awk -v s="$1" 'BEGIN {
        n = s + 0; unit = tolower(substr(s, length(s)))
        if (unit == "k") n *= 1024; else if (unit == "m") n *= 1048576; else if (unit == "g") n *= 1073741824
        printf "%.0f", n }'
}

NGINX_UPSTREAM=${NGINX_UPSTREAM:-app:8000}
NGINX_PORT=${NGINX_PORT:-8080}
NGINX_METRICS_PORT=${NGINX_METRICS_PORT:-9090}
NGINX_LISTEN_ADDRESS=${NGINX_LISTEN_ADDRESS:-}
NGINX_STATUS_PORT=${NGINX_STATUS_PORT:-0}
NGINX_GRPC_PORT=${NGINX_GRPC_PORT:-0}
NGINX_GRPC_UPSTREAM=${NGINX_GRPC_UPSTREAM:-}
SERVING_MAX_BODY_BYTES=${SERVING_MAX_BODY_BYTES:-1048576}
SERVING_REQUEST_TIMEOUT_S=${SERVING_REQUEST_TIMEOUT_S:-10}
SERVING_GENERATION_TIMEOUT_S=${SERVING_GENERATION_TIMEOUT_S:-0}
NGINX_TIMEOUT_MARGIN_S=${NGINX_TIMEOUT_MARGIN_S:-5}
SERVING_KEEPALIVE_S=${SERVING_KEEPALIVE_S:-5}
NGINX_UPSTREAM_KEEPALIVE=${NGINX_UPSTREAM_KEEPALIVE:-32}
NGINX_UPSTREAM_MAX_CONNS=${NGINX_UPSTREAM_MAX_CONNS:-0}
NGINX_CLIENT_TIMEOUT_S=${NGINX_CLIENT_TIMEOUT_S:-10}
NGINX_KEEPALIVE_TIMEOUT_S=${NGINX_KEEPALIVE_TIMEOUT_S:-15}
NGINX_CONN_LIMIT_PER_CLIENT=${NGINX_CONN_LIMIT_PER_CLIENT:-128}
NGINX_CLIENT_BODY_BUFFER_SIZE=${NGINX_CLIENT_BODY_BUFFER_SIZE:-128k}
NGINX_BODY_SPOOL_BYTES=${NGINX_BODY_SPOOL_BYTES:-128m}
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
NGINX_ENVSUBST_OUTPUT_DIR=${NGINX_ENVSUBST_OUTPUT_DIR:-/tmp/nginx}

check_upstream() {
    # check_upstream NAME VALUE: host:port or unix:/path, nothing nginx would misread
    case $2 in
        *://*) die "$1 is host:port or unix:/path (no scheme), got '$2'" ;;
        unix:/*) case $2 in *[!A-Za-z0-9._/:-]*) die "$1 has characters nginx cannot take: '$2'" ;; esac ;;
        *:*) if ! is_host "${2%:*}" || ! is_port "${2##*:}"; then
            die "$1 must be host:port or unix:/path, got '$2'"
        fi ;;
        *) die "$1 must be host:port or unix:/path, got '$2'" ;;
    esac
}
check_upstream NGINX_UPSTREAM "$NGINX_UPSTREAM"
check NGINX_PORT "$NGINX_PORT" is_port "a port number (1-65535)"
check NGINX_METRICS_PORT "$NGINX_METRICS_PORT" is_port "a port number (1-65535)"
if [ "$NGINX_STATUS_PORT" != 0 ]; then
    check NGINX_STATUS_PORT "$NGINX_STATUS_PORT" is_port "a port number (1-65535), or 0 for off"
    for other in "$NGINX_PORT" "$NGINX_METRICS_PORT" "$NGINX_TLS_PORT"; do
        # On a port nginx also listens on for everyone, the status would be
        # answered there (nginx binds the wildcard address once per port).
        [ "$NGINX_STATUS_PORT" != "$other" ] ||
            die "NGINX_STATUS_PORT ('$NGINX_STATUS_PORT') is also NGINX_PORT, NGINX_METRICS_PORT or NGINX_TLS_PORT; give it a port of its own"
    done
fi
if [ "$NGINX_GRPC_PORT" != 0 ]; then
    check NGINX_GRPC_PORT "$NGINX_GRPC_PORT" is_port "a port number (1-65535), or 0 for off"
    for other in "$NGINX_PORT" "$NGINX_METRICS_PORT" "$NGINX_TLS_PORT" "$NGINX_STATUS_PORT"; do
        # gRPC needs a listener of its own: HTTP/2 without TLS cannot share a
        # port with the HTTP/1.1 clients of the API and metrics ports.
        [ "$NGINX_GRPC_PORT" != "$other" ] ||
            die "NGINX_GRPC_PORT ('$NGINX_GRPC_PORT') is also NGINX_PORT, NGINX_METRICS_PORT, NGINX_TLS_PORT or NGINX_STATUS_PORT; give it a port of its own"
    done
    [ -n "$NGINX_GRPC_UPSTREAM" ] ||
        die "NGINX_GRPC_PORT is set but NGINX_GRPC_UPSTREAM is not; set it to the app's gRPC address (SERVING_GRPC_PORT), e.g. app:8001"
    check_upstream NGINX_GRPC_UPSTREAM "$NGINX_GRPC_UPSTREAM"
fi
[ -z "$NGINX_LISTEN_ADDRESS" ] || check NGINX_LISTEN_ADDRESS "$NGINX_LISTEN_ADDRESS" is_host "an address or host name"
check SERVING_MAX_BODY_BYTES "$SERVING_MAX_BODY_BYTES" is_uint "a whole number of bytes"
[ "$SERVING_MAX_BODY_BYTES" -gt 0 ] || die "SERVING_MAX_BODY_BYTES must be above 0 (nginx reads 0 as no limit)"
check SERVING_REQUEST_TIMEOUT_S "$SERVING_REQUEST_TIMEOUT_S" is_positive_number "a positive number of seconds"
check NGINX_TIMEOUT_MARGIN_S "$NGINX_TIMEOUT_MARGIN_S" is_positive_number "a positive number of seconds"
case $SERVING_GENERATION_TIMEOUT_S in 0) ;; *)
    check SERVING_GENERATION_TIMEOUT_S "$SERVING_GENERATION_TIMEOUT_S" is_positive_number "a number of seconds (0: the app does not generate)" ;;
esac
case $SERVING_KEEPALIVE_S in 0 | 0.0) ;; *)
    check SERVING_KEEPALIVE_S "$SERVING_KEEPALIVE_S" is_positive_number "a number of seconds (0 turns keep-alive off)" ;;
esac
check NGINX_UPSTREAM_KEEPALIVE "$NGINX_UPSTREAM_KEEPALIVE" is_uint "a whole number"
[ "$NGINX_UPSTREAM_KEEPALIVE" -gt 0 ] || die "NGINX_UPSTREAM_KEEPALIVE must be above 0"
check NGINX_UPSTREAM_MAX_CONNS "$NGINX_UPSTREAM_MAX_CONNS" is_uint "a whole number (0 turns the limit off)"
check NGINX_CLIENT_TIMEOUT_S "$NGINX_CLIENT_TIMEOUT_S" is_uint "a whole number of seconds"
[ "$NGINX_CLIENT_TIMEOUT_S" -gt 0 ] || die "NGINX_CLIENT_TIMEOUT_S must be above 0 (a slow client would hold its connection forever)"
check NGINX_KEEPALIVE_TIMEOUT_S "$NGINX_KEEPALIVE_TIMEOUT_S" is_uint "a whole number of seconds (0 turns client keep-alive off)"
check NGINX_CONN_LIMIT_PER_CLIENT "$NGINX_CONN_LIMIT_PER_CLIENT" is_uint "a whole number (0 turns the limit off)"
case $NGINX_CLIENT_BODY_BUFFER_SIZE in
    '' | *[!0-9kKmM]* | [kKmM]* | *[kKmM]?*) die "NGINX_CLIENT_BODY_BUFFER_SIZE must be bytes or a size like 128k or 1m, got '$NGINX_CLIENT_BODY_BUFFER_SIZE'" ;;
esac
case $NGINX_BODY_SPOOL_BYTES in
    '' | *[!0-9kKmMgG]* | [kKmMgG]* | *[kKmMgG]?*) die "NGINX_BODY_SPOOL_BYTES must be bytes or a size like 128m or 1g (0 turns the cap off; keep it under the size of /tmp), got '$NGINX_BODY_SPOOL_BYTES'" ;;
esac
[ "$NGINX_WORKER_PROCESSES" = auto ] || check NGINX_WORKER_PROCESSES "$NGINX_WORKER_PROCESSES" is_uint "auto or a whole number"
check NGINX_WORKER_CONNECTIONS "$NGINX_WORKER_CONNECTIONS" is_uint "a whole number"
[ "$NGINX_WORKER_CONNECTIONS" -ge 16 ] || die "NGINX_WORKER_CONNECTIONS must be 16 or more, got '$NGINX_WORKER_CONNECTIONS'"
check NGINX_RATE_LIMIT_RPS "$NGINX_RATE_LIMIT_RPS" is_uint "a whole number (0 turns the limit off)"
check NGINX_RATE_LIMIT_BURST "$NGINX_RATE_LIMIT_BURST" is_uint "a whole number"
check NGINX_TLS_PORT "$NGINX_TLS_PORT" is_port "a port number (1-65535)"
case $NGINX_LOG_LEVEL in
    debug | info | notice | warn | error | crit | alert | emerg) ;;
    *) die "NGINX_LOG_LEVEL must be one of debug info notice warn error crit alert emerg, got '$NGINX_LOG_LEVEL'" ;;
esac
check NGINX_ACCESS_LOG "$NGINX_ACCESS_LOG" is_path \
    "an absolute path of letters, digits and ._/- (/dev/stdout for the container log)"
check NGINX_ENVSUBST_OUTPUT_DIR "$NGINX_ENVSUBST_OUTPUT_DIR" is_path \
    "an absolute path of letters, digits and ._/- (the image's command reads /tmp/nginx/nginx.conf)"
if [ -n "$NGINX_TLS_CERT$NGINX_TLS_KEY" ]; then
    [ -n "$NGINX_TLS_CERT" ] || die "NGINX_TLS_KEY is set but NGINX_TLS_CERT is not; TLS needs both"
    [ -n "$NGINX_TLS_KEY" ] || die "NGINX_TLS_CERT is set but NGINX_TLS_KEY is not; TLS needs both"
    [ -r "$NGINX_TLS_CERT" ] || die "NGINX_TLS_CERT names a file that cannot be read: '$NGINX_TLS_CERT'"
    [ -r "$NGINX_TLS_KEY" ] || die "NGINX_TLS_KEY names a file that cannot be read: '$NGINX_TLS_KEY'"
fi
proxies=$(echo "$NGINX_TRUSTED_PROXIES" | tr ',' ' ')
for cidr in $proxies; do
    case $cidr in *[!0-9A-Fa-f.:/]*) die "NGINX_TRUSTED_PROXIES holds '$cidr', which is not an address or CIDR" ;; esac
done

NGINX_ENVSUBST_TEMPLATE_DIR=${NGINX_ENVSUBST_TEMPLATE_DIR:-/etc/nginx/templates}
[ -d "$NGINX_ENVSUBST_TEMPLATE_DIR" ] ||
    die "NGINX_ENVSUBST_TEMPLATE_DIR is not a directory: '$NGINX_ENVSUBST_TEMPLATE_DIR' (the image copies nginx/templates to /etc/nginx/templates)"
command -v envsubst >/dev/null ||
    die "envsubst is not installed; the nginx base image must provide it (Debian: gettext-base, alpine: gettext)"
# On a read-only root filesystem only /tmp is writable (a tmpfs or emptyDir).
if ! mkdir -p "$NGINX_ENVSUBST_OUTPUT_DIR" 2>/dev/null || [ ! -w "$NGINX_ENVSUBST_OUTPUT_DIR" ]; then
    die "NGINX_ENVSUBST_OUTPUT_DIR cannot be written by uid $(id -u): '$NGINX_ENVSUBST_OUTPUT_DIR'; mount a writable /tmp (a tmpfs)"
fi
NGINX_CONF_DIR=$NGINX_ENVSUBST_OUTPUT_DIR

# Derived values. Timeouts in milliseconds, so fractional seconds survive.
NGINX_CLIENT_MAX_BODY_SIZE=$SERVING_MAX_BODY_BYTES
NGINX_WORKER_RLIMIT_NOFILE=$((2 * NGINX_WORKER_CONNECTIONS))
# Between two reads or writes, not a total: a stream's events each reset it, but a
# generation answered in one piece sends nothing until it ends.
NGINX_PROXY_TIMEOUT=$(ms "$(awk -v a="$SERVING_REQUEST_TIMEOUT_S" -v g="$SERVING_GENERATION_TIMEOUT_S" \
    -v b="$NGINX_TIMEOUT_MARGIN_S" 'BEGIN { if (g > a) a = g; print a + b }')")ms
NGINX_UPSTREAM_KEEPALIVE_TIMEOUT=$(awk -v k="$SERVING_KEEPALIVE_S" 'BEGIN {
    ms = k * 1000 - 1000; if (ms < k * 500) ms = k * 500; if (ms < 1) ms = 1; printf "%dms", ms }')
NGINX_UPSTREAM_MAX_CONNS_PARAM= # nginx reads max_conns=0 as no limit too; leave it out
[ "$NGINX_UPSTREAM_MAX_CONNS" -eq 0 ] || NGINX_UPSTREAM_MAX_CONNS_PARAM=" max_conns=$NGINX_UPSTREAM_MAX_CONNS"
# Bodies spooled to disk at once: as many uploads of the largest body as fit
# in NGINX_BODY_SPOOL_BYTES, at least one (nginx takes at most 65535). Which
# requests count is known from their headers, before nginx reads a byte of the
# body: a Content-Length with at least as many digits as the body buffer's
# size in bytes (every length over the buffer has that many), or a chunked body.
spool_bytes=$(bytes_of "$NGINX_BODY_SPOOL_BYTES")
buffer_bytes=$(bytes_of "$NGINX_CLIENT_BODY_BUFFER_SIZE")
NGINX_BODY_SPOOL_LENGTH_DIGITS=${#buffer_bytes}
NGINX_BODY_SPOOL_UPLOADS=$(awk -v s="$spool_bytes" -v m="$SERVING_MAX_BODY_BYTES" 'BEGIN {
    n = int(s / m); if (n < 1) n = 1; if (n > 65535) n = 65535; printf "%d", n }')
NGINX_LIMIT_REQ_BURST= # nginx refuses burst=0; no burst is the same thing
[ "$NGINX_RATE_LIMIT_BURST" -eq 0 ] || NGINX_LIMIT_REQ_BURST=" burst=$NGINX_RATE_LIMIT_BURST nodelay"
case $NGINX_LISTEN_ADDRESS in
    '') on= ;;
    \[*) on="$NGINX_LISTEN_ADDRESS:" ;;
    *:*) on="[$NGINX_LISTEN_ADDRESS]:" ;; # a bare IPv6 address
    *) on="$NGINX_LISTEN_ADDRESS:" ;;
esac
NGINX_LISTEN=$on$NGINX_PORT
NGINX_TLS_LISTEN=$on$NGINX_TLS_PORT
NGINX_METRICS_LISTEN=$on$NGINX_METRICS_PORT
NGINX_GRPC_LISTEN=$on$NGINX_GRPC_PORT

# Every template is rendered; the optional parts take effect only through
# these include lines, each either an include or a comment saying why not.
include() {
    # include ON FILE "why it is off"
    if [ "$1" = on ]; then
        echo "include $NGINX_CONF_DIR/$2;"
    else
        echo "# $2 is not included: $3"
    fi
}
rate_limit=off
[ "$NGINX_RATE_LIMIT_RPS" -eq 0 ] || rate_limit=on
conn_limit=off
[ "$NGINX_CONN_LIMIT_PER_CLIENT" -eq 0 ] || conn_limit=on
body_spool=off
[ "$spool_bytes" = 0 ] || body_spool=on
tls=off
[ -z "$NGINX_TLS_CERT" ] || tls=on
real_ip=off
[ -z "$proxies" ] || real_ip=on
status=off
[ "$NGINX_STATUS_PORT" = 0 ] || status=on
grpc=off
[ "$NGINX_GRPC_PORT" = 0 ] || grpc=on
keepalive=on
case $SERVING_KEEPALIVE_S in 0 | 0.0) keepalive=off ;; esac
NGINX_RATE_LIMIT_ZONE_INCLUDE=$(include $rate_limit rate-limit-zone.conf "NGINX_RATE_LIMIT_RPS is 0")
NGINX_RATE_LIMIT_INCLUDE=$(include $rate_limit rate-limit.conf "NGINX_RATE_LIMIT_RPS is 0")
NGINX_CONN_LIMIT_ZONE_INCLUDE=$(include $conn_limit conn-limit-zone.conf "NGINX_CONN_LIMIT_PER_CLIENT is 0")
NGINX_CONN_LIMIT_INCLUDE=$(include $conn_limit conn-limit.conf "NGINX_CONN_LIMIT_PER_CLIENT is 0")
NGINX_BODY_SPOOL_ZONE_INCLUDE=$(include $body_spool body-spool-zone.conf "NGINX_BODY_SPOOL_BYTES is 0")
NGINX_BODY_SPOOL_INCLUDE=$(include $body_spool body-spool.conf "NGINX_BODY_SPOOL_BYTES is 0")
NGINX_TLS_INCLUDE=$(include $tls tls.conf "NGINX_TLS_CERT and NGINX_TLS_KEY are not set")
NGINX_STATUS_INCLUDE=$(include $status status.conf "NGINX_STATUS_PORT is 0")
NGINX_GRPC_INCLUDE=$(include $grpc grpc.conf "NGINX_GRPC_PORT is 0")
NGINX_REAL_IP_INCLUDE=$(include $real_ip real-ip.conf \
    "NGINX_TRUSTED_PROXIES is not set; the client is the peer address")
NGINX_UPSTREAM_KEEPALIVE_INCLUDE=$(include $keepalive upstream-keepalive.conf \
    "SERVING_KEEPALIVE_S is 0; gunicorn closes every connection")
# One set_real_ip_from line per trusted proxy (an empty list when it is off).
NGINX_SET_REAL_IP_FROM=
for cidr in $proxies; do
    NGINX_SET_REAL_IP_FROM="${NGINX_SET_REAL_IP_FROM}set_real_ip_from $cidr;
"
done

# envsubst (and the awk that lists the names) reads them from the environment.
export NGINX_UPSTREAM NGINX_PORT NGINX_METRICS_PORT NGINX_LISTEN_ADDRESS SERVING_MAX_BODY_BYTES \
    NGINX_STATUS_PORT NGINX_STATUS_INCLUDE NGINX_GRPC_PORT NGINX_GRPC_UPSTREAM NGINX_GRPC_LISTEN \
    NGINX_GRPC_INCLUDE \
    SERVING_REQUEST_TIMEOUT_S NGINX_TIMEOUT_MARGIN_S SERVING_KEEPALIVE_S NGINX_UPSTREAM_KEEPALIVE \
    NGINX_UPSTREAM_MAX_CONNS NGINX_UPSTREAM_MAX_CONNS_PARAM \
    NGINX_CLIENT_TIMEOUT_S NGINX_KEEPALIVE_TIMEOUT_S NGINX_CONN_LIMIT_PER_CLIENT \
    NGINX_CLIENT_BODY_BUFFER_SIZE NGINX_WORKER_PROCESSES NGINX_WORKER_RLIMIT_NOFILE \
    NGINX_WORKER_CONNECTIONS NGINX_RATE_LIMIT_RPS NGINX_RATE_LIMIT_BURST NGINX_TRUSTED_PROXIES \
    NGINX_TLS_CERT NGINX_TLS_KEY NGINX_TLS_PORT NGINX_ACCESS_LOG NGINX_LOG_LEVEL \
    NGINX_ENVSUBST_OUTPUT_DIR NGINX_CONF_DIR NGINX_CLIENT_MAX_BODY_SIZE NGINX_PROXY_TIMEOUT \
    NGINX_UPSTREAM_KEEPALIVE_TIMEOUT NGINX_LIMIT_REQ_BURST NGINX_LISTEN NGINX_TLS_LISTEN \
    NGINX_METRICS_LISTEN NGINX_RATE_LIMIT_ZONE_INCLUDE NGINX_RATE_LIMIT_INCLUDE NGINX_TLS_INCLUDE \
    NGINX_CONN_LIMIT_ZONE_INCLUDE NGINX_CONN_LIMIT_INCLUDE NGINX_BODY_SPOOL_BYTES \
    NGINX_BODY_SPOOL_LENGTH_DIGITS NGINX_BODY_SPOOL_UPLOADS NGINX_BODY_SPOOL_ZONE_INCLUDE \
    NGINX_BODY_SPOOL_INCLUDE \
    NGINX_REAL_IP_INCLUDE NGINX_UPSTREAM_KEEPALIVE_INCLUDE NGINX_SET_REAL_IP_FROM NGINX_ENVSUBST_TEMPLATE_DIR

# Only NGINX_* and SERVING_* names are substituted, so nginx's own $variables
# ($request_id, $status ...) reach nginx as written: envsubst is given the list
# of names to fill in, taken from the environment as it is now.
names=$(awk 'BEGIN { for (name in ENVIRON) if (name ~ /^(NGINX|SERVING)_/) printf "${%s} ", name }')
templates=$(find "$NGINX_ENVSUBST_TEMPLATE_DIR" -follow -type f -name '*.template' | sort)
[ -n "$templates" ] || die "NGINX_ENVSUBST_TEMPLATE_DIR holds no *.template file: '$NGINX_ENVSUBST_TEMPLATE_DIR'"
# Each template becomes the same path, less the suffix, under the output dir.
while IFS= read -r template; do
    relative=${template#"$NGINX_ENVSUBST_TEMPLATE_DIR"/}
    target=$NGINX_ENVSUBST_OUTPUT_DIR/${relative%.template}
    if ! mkdir -p "$(dirname "$target")" || ! envsubst "$names" <"$template" >"$target"; then
        die "could not render '$template' into '$target'"
    fi
done <<EOF
$templates
EOF
echo "serving-core-nginx: settings checked, $NGINX_ENVSUBST_TEMPLATE_DIR rendered into $NGINX_ENVSUBST_OUTPUT_DIR" >&2

[ $# -gt 0 ] || die "no command to run; the image's CMD is nginx -c /tmp/nginx/nginx.conf -e stderr -g 'daemon off;'"
# nginx replaces this shell: it is PID 1 and gets the stop signal (SIGQUIT) itself.
exec "$@"
