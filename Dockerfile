# The web app (support chat + completion API, gunicorn) and the Celery worker: no torch, no GPU.
FROM python:3.11-slim
WORKDIR /srv
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1
COPY pyproject.toml README.md ./
COPY app app
COPY pipelines pipelines
COPY filters filters
COPY monitoring monitoring
COPY configs configs
COPY inference inference
COPY httpkit httpkit
# the CPU build of torch is the smallest that satisfies the package's pin (the embedder runs here)
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.11,<2.15" \
 && pip install .
EXPOSE 8000 9808
CMD ["gunicorn", "-c", "app/gunicorn_conf.py", "app:create_app()"]
