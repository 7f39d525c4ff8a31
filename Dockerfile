# naiad as a SageMaker hosting container (CPU).
#
#   docker build -t naiad .                            # lean: no torch
#   docker build -t naiad --build-arg WITH_TORCH=true .  # + CPU torch, for TorchScript models
#   docker run -p 8080:8080 -v $PWD/model:/opt/ml/model naiad serve
#
# SageMaker starts the image as `docker run IMAGE serve`; the entry point turns that into
# `naiad sagemaker serve`, which reads SageMaker's environment as Triton's serve script does.
#
# Python packages are pinned by docker/constraints.txt (tools/container/lock.sh regenerates it), so rebuilding a tree
# gives the same image. Where Docker Hub is out of reach, tools/container/base_image.sh builds the FROM image locally;
# tests/container/test_docker.py builds and runs this file as SageMaker does.

# Build the wheel in its own stage so the final image carries no source tree and no build tools.
FROM python:3.11-slim AS wheel
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# pyproject's build backend in a cached layer of its own, so a code change doesn't fetch it again (build isolation
# would, on every build).
RUN pip install "setuptools>=68"
COPY pyproject.toml README.md triton_python_backend_utils.py ./
COPY naiad ./naiad
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

FROM python:3.11-slim

# true: add CPU-only torch (pytorch_libtorch models); its CUDA wheels would add gigabytes for nothing here.
ARG WITH_TORCH=false
ARG TORCH_VERSION=
# boto3 serves s3:// model repositories and --sagemaker-model-data-url; set to "" to leave it out.
ARG EXTRA_PIP_PACKAGES=boto3

LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
LABEL com.amazonaws.sagemaker.capabilities.multi-models=true

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# The runtime dependencies first, pinned to docker/constraints.txt (tools/container/lock.sh writes it), in a layer
# of their own: a change to naiad's code rebuilds only the small layer below instead of downloading them again.
COPY docker/constraints.txt pyproject.toml /tmp/build/
RUN set -eux; \
    if [ "$WITH_TORCH" = "true" ]; then \
        pip install --index-url https://download.pytorch.org/whl/cpu "torch${TORCH_VERSION:+==$TORCH_VERSION}"; \
    fi; \
    python -c 'import tomllib; print("\n".join(tomllib.load(open("/tmp/build/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/build/requirements.txt; \
    pip install -c /tmp/build/constraints.txt -r /tmp/build/requirements.txt $EXTRA_PIP_PACKAGES

COPY --from=wheel /wheels /tmp/wheels
# -c again: a dependency pyproject gained after the last lock.sh still installs (unpinned), the rest stay pinned.
# The server imports tritonclient's generated modules only (no clients), so they are checked here too.
RUN set -eux; \
    pip install -c /tmp/build/constraints.txt /tmp/wheels/naiad-*.whl; \
    rm -rf /tmp/wheels /tmp/build; \
    pip check; \
    naiad --version; \
    python -c 'import tritonclient.grpc.service_pb2, tritonclient.grpc.model_config_pb2'

# SageMaker sends /ping and /invocations here (SAGEMAKER_BIND_TO_PORT may move it).
EXPOSE 8080

ENTRYPOINT ["naiad", "sagemaker"]
CMD ["serve"]
