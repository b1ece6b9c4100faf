# vLLM's router (PyPI `vllm-router`) as an image for deploy/compose.yaml.
FROM python:3.12-slim-bookworm
RUN pip install --no-cache-dir vllm-router==0.1.17
USER nobody
ENTRYPOINT ["vllm-router"]
