# gpuscaler controller image: slim, non-root, works with a read-only root filesystem.
#   docker build -t gpuscaler:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
# Dependencies first, pinned with hashes (requirements.lock, `make lock`; tests/test_lock.py
# checks it against pyproject.toml): the image is the same on every build, and a
# tampered or re-uploaded file fails the build. Then gpuscaler itself, adding nothing.
COPY requirements.lock ./
RUN python -m venv /opt/gpuscaler \
 && /opt/gpuscaler/bin/pip install --no-cache-dir --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY gpuscaler ./gpuscaler
RUN /opt/gpuscaler/bin/pip install --no-cache-dir --no-deps . \
 && /opt/gpuscaler/bin/pip check \
 && /opt/gpuscaler/bin/python -m compileall -q /opt/gpuscaler

FROM python:3.11-slim
COPY --from=build /opt/gpuscaler /opt/gpuscaler
# Nothing is written at run time: no bytecode, matplotlib's cache in the /tmp emptyDir.
ENV PATH=/opt/gpuscaler/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["gpuscaler"]
CMD ["run", "--config", "/etc/gpuscaler/gpuscaler.yaml"]
