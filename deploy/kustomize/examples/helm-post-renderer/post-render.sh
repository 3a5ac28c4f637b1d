#!/bin/sh
# Helm's post-renderer: reads the manifests Helm rendered on stdin, adds the kvoffload sidecar
# to the Deployment target/ names (the sidecar component), writes the result to stdout:
#   helm upgrade --install vllm vllm/vllm-stack -f values.yaml --post-renderer ./post-render.sh
# Copy this folder next to your values (keeping the path to components/sidecar valid).
set -eu
cd "$(dirname "$0")"
cat > all.yaml
exec kubectl kustomize .
