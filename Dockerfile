# syntax=docker/dockerfile:1
# dprelease image: the API by default; the same image runs the Celery workers with
#   celery -A worker.celery_app worker -Q long,celery --loglevel=info --concurrency=1 --prefetch-multiplier=1 --pool=threads
# (-Q long,celery: both lanes of the CPU mechanisms; -Q celery: a short-lane worker that never
# takes a long job; -Q gpu-long,gpu on a worker that holds a GPU; -Q celery,long,gpu,gpu-long
# for a CPU-only host's worker of every queue: see docker-compose.yml and docs/operations.md).
#
# torch comes from the PyTorch index given by TORCH_INDEX_URL (CPU wheels by default). For a GPU
# image build with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128.
# constraints.txt pins torch==2.13.0, which a local build such as 2.13.0+cpu or 2.13.0+cu128
# satisfies, so the later installs keep the torch installed here.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------- build
FROM ${PYTHON_IMAGE} AS build

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH

# hadolint ignore=DL3013
RUN python -m venv /opt/venv \
 && pip install --upgrade pip \
 && pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0

WORKDIR /src

# Dependencies first (cached while pyproject.toml and constraints.txt are unchanged).
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(deps))" > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt

# Then the package itself (not editable: the runtime stage gets only /opt/venv).
COPY README.md ./
COPY service ./service
COPY worker ./worker
COPY dpcore ./dpcore
COPY dprelease_cli ./dprelease_cli
COPY migrations ./migrations
RUN pip install -c constraints.txt . \
 && pip check

# -------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    DPRELEASE_HOME=/data \
    DPRELEASE_HOST=0.0.0.0 \
    DPRELEASE_PORT=8000

RUN groupadd --system --gid 10001 dprelease \
 && useradd --system --uid 10001 --gid dprelease --create-home --home-dir /home/dprelease \
        --shell /usr/sbin/nologin dprelease \
 && install -d -o dprelease -g dprelease -m 0750 /data

COPY --from=build /opt/venv /opt/venv

USER 10001:10001
WORKDIR /data
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('DPRELEASE_PORT', '8000'), timeout=4)"]

# The API (applies migrations at start). Workers: see the command at the top of this file.
CMD ["dprelease-server"]
