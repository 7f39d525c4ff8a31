# naiad as a SageMaker hosting container (CPU).
#
#   docker build -t naiad .                            # lean: no torch
#   docker build -t naiad --build-arg WITH_TORCH=true .  # + CPU torch, for TorchScript models
#   docker run -p 8080:8080 -v $PWD/model:/opt/ml/model naiad serve
#
# SageMaker starts the image as `docker run IMAGE serve`; the entry point turns that into
# `naiad sagemaker serve`, which reads SageMaker's environment as Triton's serve script does.

# Build the wheel in its own stage so the final image carries no source tree and no build tools.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md triton_python_backend_utils.py ./
COPY naiad ./naiad
RUN PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    pip wheel --no-deps --wheel-dir /wheels .

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

COPY --from=wheel /wheels /tmp/wheels
RUN set -eux; \
    if [ "$WITH_TORCH" = "true" ]; then \
        pip install --index-url https://download.pytorch.org/whl/cpu "torch${TORCH_VERSION:+==$TORCH_VERSION}"; \
    fi; \
    pip install /tmp/wheels/naiad-*.whl $EXTRA_PIP_PACKAGES; \
    rm -rf /tmp/wheels; \
    naiad --version

# SageMaker sends /ping and /invocations here (SAGEMAKER_BIND_TO_PORT may move it).
EXPOSE 8080

ENTRYPOINT ["naiad", "sagemaker"]
CMD ["serve"]
