# syntax=docker/dockerfile:1
# cotenant: the agent (`cotenant agent`) and central serve (`cotenant serve`) from one image.
#
#   make image                       # docker build -t cotenant:0.1.0 .
#   docker run --rm -p 8050:8050 cotenant:0.1.0 demo
#
# Two stages: `builder` builds the wheel (with the dashboard's plotly.js cartesian bundle when
# the npm registry answers; the full bundle plotly.py ships otherwise) and every dependency's
# wheel; `runtime` installs them from the builder without a network, a compiler or a copy of
# the wheels in any layer, and runs as an unprivileged user. docs/fleet.md, "The container
# image", says what was verified of it.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cotenant ./cotenant
COPY scripts/fetch-plotly-bundle.py ./scripts/
# the dependencies' wheels first (a layer reused while pyproject.toml's pins hold), then the
# project installed here so that the bundle script can import it, then the project's wheel
# again with the bundle inside (package data: cotenant/dashboard/vendor/*.js)
RUN pip wheel --wheel-dir /wheels . \
 && pip install --no-cache-dir --no-index --find-links /wheels cotenant==0.1.0 \
 && python scripts/fetch-plotly-bundle.py \
 && rm /wheels/cotenant-*.whl \
 && pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    COTENANT_SERVER_HOST=0.0.0.0 \
    COTENANT_OTLP_HOST=0.0.0.0
# the wheels are bind-mounted from the builder for this one step: none of them stays in a
# layer; pip's build backends go with them (the image builds nothing)
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels cotenant==0.1.0 \
 && pip uninstall --yes setuptools wheel \
 && groupadd --system --gid 10001 cotenant \
 && useradd --system --uid 10001 --gid cotenant --home-dir /var/lib/cotenant \
      --create-home --shell /usr/sbin/nologin cotenant
# relative store paths (./.cotenant/…) land in the user's home; the manifests mount a volume
# here, as the agent's root filesystem is read-only
WORKDIR /var/lib/cotenant
USER 10001:10001
# OTLP/gRPC, OTLP/HTTP, HTTP API + /metrics + dashboard
EXPOSE 4317 4318 8050
ENTRYPOINT ["cotenant"]
CMD ["serve"]
