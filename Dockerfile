# serving-core: one handler served by gunicorn, the model baked into the image.
#
#   make image HANDLER_DIR=handlers/NAME                      # the same, through make
#   docker build -t serving-core .                            # handlers/minilm, CPU torch
#   docker build -t serving-core:echo --build-arg HANDLER_DIR=handlers/echo .
#   docker build -t serving-core:iris-setosa --build-arg HANDLER_DIR=handlers/iris-setosa \
#     --build-arg SHARED_DIRS=handlers/iris .                  # imports handlers/iris
#   docker build -t serving-core:cu128 --build-arg TORCH_VARIANT=cu128 .
#   docker build -t serving-core:NAME --build-arg HANDLER_DIR=handlers/NAME \
#     --build-arg MODEL_DIR=models/NAME .                      # weights in /models
#
# Base image: python:3.11-slim-bookworm, named literally by both stages' FROM
# lines so that Dependabot (its docker ecosystem, .github/dependabot.yml) reads
# and bumps it; it cannot see a base named by an ARG default (dependabot-core
# #2057). Another base without editing this file, by name:
#   docker buildx build --build-context python:3.11-slim-bookworm=docker-image://REGISTRY/python:TAG .
#   podman build --build-context python:3.11-slim-bookworm=docker-image://REGISTRY/python:TAG .
# (the container tests build on a local stand-in that way, tests/container/bases.py).
#
# Build arguments
#   HANDLER_DIR      the handler folder to serve: its requirements.txt (optional)
#                    is installed, its files copied to /app/HANDLER_DIR, and
#                    SERVING_HANDLER points at the folder, so a handler.py or a
#                    pipeline.yaml in it is served (handlers/minilm); its
#                    build.py, if any, runs at build (handlers/textgen trains
#                    its model so)
#   SHARED_DIRS      folders of code the handler imports from beside it,
#                    space-separated, each copied to /app as it is in the
#                    repository: handlers/iris for the iris classifiers,
#                    handlers/minilm for minilm-prep and minilm-ids; their
#                    requirements belong in the handler's requirements.txt ("")
#   TORCH_VARIANT    which torch build a handler's torch resolves to: cpu, or a
#                    CUDA build such as cu128 (cpu)
#   TORCH_INDEX_URL  the index of that build, an extra index beside PyPI; empty
#                    for PyPI alone, where that index cannot be reached
#                    (https://download.pytorch.org/whl/${TORCH_VARIANT})
#   VERSION, REVISION, SOURCE   OCI labels of a local build: version, git commit,
#                    repository URL. CI sets every OCI label once, with
#                    docker/metadata-action's --label flags, which take
#                    precedence over the LABEL below (image.yml)
#   MODEL_REVISION   SERVING_MODEL_REVISION, the cache's build key (default:
#                    REVISION); CI passes the commit
#   MODEL_DIR        a folder of the build context holding the model's
#                    artifacts (models/NAME: .dockerignore lets models/ in),
#                    baked into /models in a layer of their own, and
#                    SERVING_MODEL_URI=/models, which serving-core reads in
#                    place (never copied). Empty: no weights baked, /models is
#                    empty and SERVING_MODEL_URI is empty, which means none ("")
#
# Environment (the full table is docs/settings.md; these are the image's values)
#   SERVING_HANDLER  ${HANDLER_DIR}, relative to /app
#   SERVING_BIND     127.0.0.1:8000: alone, the image serves no one outside its
#                    container, and says so at start. Behind nginx in another
#                    container, set 0.0.0.0:8000 (docker-compose.yml does; the
#                    chart uses a unix socket). The HEALTHCHECK follows it (TCP
#                    or unix:)
#   SERVING_MODEL_REVISION  ${MODEL_REVISION}: part of every inference cache key, so a
#                    new image never serves the old one's cached answers
#   SERVING_MODEL_URI  /models when MODEL_DIR is given, else empty (none): the
#                    chart's model.uri or compose sets a store's URI instead
#   SERVING_*        workers, threads, batching, limits and timeouts: unset
#                    here, so serving-core's defaults apply (docs/settings.md)
#   HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE = 1: the model is in the image and
#                    start-up never reaches the network
#
# System packages: a handler that needs a system library (libgomp1 for
# LightGBM, ffmpeg, libgl1 for OpenCV) names its Debian packages in
# HANDLER_DIR/system-packages.txt, one per line (name or name=version; # starts
# a comment). They are installed with apt-get in both stages: in the build
# stage before the handler's requirements (which may build against them), and
# in the image, where the handler loads them.
#
# Layers, least to most often changed: the framework's requirements, the
# handler's system packages, its requirements, the model's weights (MODEL_DIR),
# serving_core, the handler's code (and SHARED_DIRS).
# Editing handler.py rebuilds only the last; editing serving_core reinstalls no
# model stack and pushes no weights again, and the image it makes differs only
# by the package's own layer and the code's.
#
# The handler is loaded and its sample.json run at build time
# (`serving-core check`), so a broken handler or a missing model fails the
# build, not the deployment. Runs as uid 10001; writes only under /tmp, so the
# root filesystem may be read-only with /tmp as a tmpfs.

FROM python:3.11-slim-bookworm AS build
ARG HANDLER_DIR=handlers/minilm
ARG SHARED_DIRS=""
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Every pip install here goes through constraints.txt: the versions serving-core
# is tested with, torch==2.13.0 among them.
COPY requirements.txt constraints.txt ./
RUN pip install --constraint constraints.txt --requirement requirements.txt

# The handler's system packages (see the top): docker/install-system-packages.sh
# checks each name, then apt-get installs them. system-packages*.txt makes the
# file optional (COPY fails only when no source matches; the script always
# does). The same step is in the image stage below.
COPY docker/install-system-packages.sh ${HANDLER_DIR}/system-packages*.txt /tmp/system-packages/
RUN /tmp/system-packages/install-system-packages.sh "${HANDLER_DIR}"

# The handler's requirements before its code, so an edit to handler.py keeps
# this (large) layer; optional, as above. The torch index is an extra index, so
# torch==2.13.0 (pinned or not by the handler) resolves to its +cpu or +cuXXX
# build there, not to PyPI's default build; none when TORCH_INDEX_URL is empty.
COPY constraints.txt ${HANDLER_DIR}/requirements*.txt handler-requirements/
RUN if [ -f handler-requirements/requirements.txt ]; then \
        pip install --constraint constraints.txt \
            ${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"} \
            --requirement handler-requirements/requirements.txt; \
    fi

# Dependencies are installed and pinned above; serving-core itself becomes a
# wheel that the image installs on top of the copied environment. Installed into
# /opt/venv here, an edit to serving_core would change that whole copy (torch
# included, about 2 GB) instead of one layer the size of the package: every
# commit would push, and every build would store, the model stack again.
COPY pyproject.toml setup.py README.md ./
COPY serving_core/ serving_core/
RUN pip wheel --no-deps --wheel-dir /wheels .

# Last: the layers an edit to the handler rebuilds. A handler may import code
# from a sibling folder (the iris classifiers put handlers/ on sys.path and
# import handlers/iris/onevsrest.py): SHARED_DIRS names those folders, copied
# from the handlers here to where the handler finds them. Only /app reaches the
# image, so it holds just the handler and what it imports.
COPY handlers/ /src/handlers/
RUN for dir in ${SHARED_DIRS}; do \
        dir="${dir%/}"; \
        case "$dir" in \
            handlers/*/*|handlers/.*) false ;; \
            handlers/?*) test -d "$dir" ;; \
            *) false ;; \
        esac || { echo "SHARED_DIRS: $dir is not a folder handlers/NAME of this repository" >&2; exit 1; }; \
        mkdir -p /app/handlers && cp -R "$dir" "/app/$dir"; \
    done
COPY ${HANDLER_DIR}/ /app/${HANDLER_DIR}/
# A handler folder's own build step, when it has a build.py (handlers/textgen
# trains its model here): it runs with the handler's requirements, and what it
# writes into the folder ships in the image, which is read-only at run time.
RUN if [ -f "/app/${HANDLER_DIR}/build.py" ]; then python "/app/${HANDLER_DIR}/build.py"; fi


# The same base as the build stage (its venv's python is this one's).
FROM python:3.11-slim-bookworm
ARG HANDLER_DIR=handlers/minilm
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
ARG SOURCE=https://github.com/serving-core/serving-core
ARG MODEL_REVISION=${REVISION}
ARG MODEL_DIR=""
# The framework's version, apart from the image's own (a template user's tag):
# pyproject.toml's, which tests/deploy/test_versions.py keeps this default equal to.
# Not SERVING_*: an ARG is in each RUN's environment, and `serving-core check`
# below refuses a SERVING_ variable it does not know.
ARG FRAMEWORK_VERSION=0.1.0
LABEL org.opencontainers.image.title="serving-core" \
      io.github.serving-core.version="${FRAMEWORK_VERSION}" \
      org.opencontainers.image.description="A handler.py served over REST by gunicorn with batching and backpressure" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

# /var/cache/serving-core/models is SERVING_MODEL_CACHE in compose and the chart:
# owned by the serving user, so that a new named volume mounted there (which
# docker and podman create with the image folder's owner) takes fetched models.
RUN groupadd --system --gid 10001 serving \
    && useradd --system --uid 10001 --gid serving --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin serving \
    && install -d -o 10001 -g 10001 -m 0750 /var/cache/serving-core/models

# The handler's system packages again, for the libraries it loads at run time.
COPY docker/install-system-packages.sh ${HANDLER_DIR}/system-packages*.txt /tmp/system-packages/
RUN /tmp/system-packages/install-system-packages.sh "${HANDLER_DIR}"

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/tmp/huggingface \
    SERVING_HANDLER=${HANDLER_DIR} \
    SERVING_BIND=127.0.0.1:8000 \
    SERVING_MODEL_REVISION=${MODEL_REVISION}

# The Rust tokenizer's thread pool is not fork-safe and competes with the model
# for the cores. DL3064 reads "TOKEN" in the name as a secret; it is not one.
# hadolint ignore=DL3064
ENV TOKENIZERS_PARALLELISM=false

COPY --from=build /opt/venv /opt/venv
# The model's weights, between the dependencies and the code: an edit to
# handler.py or serving_core leaves this layer's digest as it was, so a push
# sends only the code again, not gigabytes of weights. From the build context
# straight into this stage (never through the build stage, which would store
# them twice). Owned by root and read-only to the serving user; files keep their
# mode and modification time from the context, so the same files make the same
# layer. Without MODEL_DIR the source is docker/no-model, which .dockerignore
# empties: /models is an empty folder and SERVING_MODEL_URI is "", none.
COPY ${MODEL_DIR:-docker/no-model}/ /models/
ENV SERVING_MODEL_URI=${MODEL_DIR:+/models}
COPY --from=build /wheels /tmp/wheels
# The wheel only: its dependencies are in the environment above, and pip asks
# no index.
RUN PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
        pip install --no-deps --no-index /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels
COPY --from=build /app /app
WORKDIR /app
USER 10001:10001

# Offline, as the non-root user: the image must serve as built.
RUN serving-core check "${SERVING_HANDLER}" > /dev/null

# SERVING_BIND is 127.0.0.1:8000 by default, so the port answers only inside
# the container until SERVING_BIND=0.0.0.0:8000 opens it (docker-compose.yml
# does, for nginx beside it; the chart's nginx reaches gunicorn over a unix
# socket instead).
EXPOSE 8000
# Liveness of gunicorn itself, asked at SERVING_BIND whether TCP or a unix
# socket (slim images have no curl). Readiness is /readyz, which the compose
# file and the chart probe.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["serving-core", "healthcheck", "--timeout-s", "2"]

# Exec form: gunicorn is PID 1 and gets SIGTERM itself, so it drains.
CMD ["serving-core", "serve"]
