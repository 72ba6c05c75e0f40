#!/usr/bin/env bash
# Launch `distlab fit` with torchrun on one node (all GPUs, or N CPU processes) or several nodes.
#
#   scripts/torchrun.sh configs/demo_cpu.yaml                      # all GPUs of this node (or 1 CPU process)
#   NPROC=2 scripts/torchrun.sh configs/demo_cpu.yaml              # 2 CPU processes (gloo)
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 scripts/torchrun.sh configs/demo_cpu.yaml --config configs/trainer/gpu_ddp.yaml
#
# The trainer's devices / num_nodes / strategy are matched to torchrun's world size by distlab
# (a mismatch is a one-line error, never a silent single process).
set -euo pipefail
config=${1:?usage: scripts/torchrun.sh CONFIG [extra distlab args]}
shift
if [[ -z "${NPROC:-}" ]]; then
  NPROC=$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")
fi
NNODES=${NNODES:-1}
if [[ "$NNODES" == 1 ]]; then
  exec torchrun --standalone --nproc_per_node="$NPROC" -m distlab fit --config "$config" --config configs/trainer/torchrun.yaml "$@"
fi
exec torchrun --nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK}" --nproc_per_node="$NPROC" \
  --rdzv_backend=c10d --rdzv_endpoint="${MASTER_ADDR:?set MASTER_ADDR}:${MASTER_PORT:-29500}" \
  -m distlab fit --config "$config" --config configs/trainer/torchrun.yaml "$@"
