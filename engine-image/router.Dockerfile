# The kvscale router image: `kvscale-router`, non-root. It installs only `kvscale[router]`: no
# torch, so a CPU node pulls an HTTP proxy, not the engine's CUDA libraries. The router pods the
# operator renders run it (the operator's default router image).
#
# Built by engine-image/build-image.sh (`make image`) next to the engine and operator images, from
# the same staged context and debootstrap base; on an ordinary machine:
#   docker build -f engine-image/router.Dockerfile --build-arg BASE_IMAGE=python:3.11-slim-bookworm .
ARG BASE_IMAGE=kvscale/debian-base:bookworm

FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180
COPY ca-bundle.crt* /tmp/build/
RUN if [ -s /tmp/build/ca-bundle.crt ]; then export PIP_CERT=/tmp/build/ca-bundle.crt; fi \
 && python3 -m venv /opt/kvscale \
 && /opt/kvscale/bin/pip install --upgrade pip setuptools
COPY . /src
# the router and its Kubernetes source import, and nothing brought torch in
RUN if [ -s /tmp/build/ca-bundle.crt ]; then export PIP_CERT=/tmp/build/ca-bundle.crt; fi \
 && /opt/kvscale/bin/pip install --no-build-isolation "/src[router]" \
 && /opt/kvscale/bin/python -c "import importlib.util as u, kvscale_router.cli, kvscale_router.kube_source; assert u.find_spec('torch') is None, 'torch is installed'" \
 && /opt/kvscale/bin/kvscale-router --help > /dev/null
# the stage's name, last: build-image.sh prunes earlier builds' stages by it
LABEL io.kvscale.stage=router-builder

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="kvscale router"
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin kvscale
COPY --from=builder /opt/kvscale /opt/kvscale
ENV PATH=/opt/kvscale/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/kvscale
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["kvscale-router"]
CMD ["--help"]
