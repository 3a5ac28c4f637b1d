# The kvoffload sidecar image: the package and its runtime dependencies only (no extras: no
# grafanalib, no test tools), in a virtual environment copied onto a clean base, run as nobody.
#   docker build -t kvoffload:0.1.0 .
#   docker run --rm -p 19400:19400 kvoffload:0.1.0 serve --target http://vllm:8000/metrics
# The same image runs the simulator: `sim --web.listen-address 0.0.0.0:8000 ...` (README).
# tests/deploy/test_dockerfile.py checks this file (pinned bases, non-root, multi-stage, ...).

FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A C compiler for the compiled recording scan (setup.py; it stays in this stage). Debian's
# current gcc: pinning a version would break the build at the next point release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md LICENSE ./
COPY exporter ./exporter
# `--version` names the recording scan: the build fails if the compiled one is missing.
RUN python -m venv /opt/kvoffload \
    && /opt/kvoffload/bin/pip install --no-cache-dir . \
    && /opt/kvoffload/bin/pip uninstall --yes pip setuptools \
    && /opt/kvoffload/bin/kvoffload --version | grep -q "recording scan: compiled"

FROM python:3.11.13-slim-bookworm
LABEL org.opencontainers.image.title="kvoffload" \
      org.opencontainers.image.description="Is vLLM's CPU KV offloading paying off? A sidecar exporter." \
      org.opencontainers.image.source="https://github.com/kvoffload/kvoffload" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
COPY --from=build /opt/kvoffload /opt/kvoffload
ENV PATH=/opt/kvoffload/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# nobody:nogroup; Kubernetes' runAsNonRoot needs the numeric form.
USER 65534:65534
EXPOSE 19400
# `kvoffload healthcheck` asks /healthz where and how `serve` listens: the same flags'
# variables (KVOFFLOAD_SERVE_WEB_LISTEN_ADDRESS, then KVOFFLOAD_WEB_LISTEN_ADDRESS), https
# when the web config file has TLS.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["kvoffload", "healthcheck"]
ENTRYPOINT ["kvoffload"]
CMD ["serve", "--target", "http://127.0.0.1:8000/metrics"]
