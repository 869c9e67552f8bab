"""What the run and pruning plans assume of the machines: memory, throughputs and the fixed cost of one process.

:data:`GPU_NODE` is an 8 x H100 80 GB SXM node (throughputs assumed, not measured); :data:`CPU_HOST` is this
project's 2-core CPU machine (process constant measured). Job keys replace the memory figures (``spp.planning.job``).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class Hardware:
    """Machine figures of a run plan and of a pruning plan.

    Attributes:
        kind: ``gpu`` or ``cpu`` (where the model computes).
        device_gib: Memory of one GPU (``None`` on CPU: everything is host memory).
        host_gib: Host memory of one node (``None``: not checked).
        train_tflops: Sustained training throughput of one device (bf16; H100 dense peak 989, so 300 is about 30 %
            MFU, what FSDP fine-tuning of 7-70B models reaches with activation checkpointing).
        eval_tflops: Sustained forward throughput of one device (perplexity, lm-eval, pruning calibration).
        prune_fp32_tflops: fp32 throughput with TF32 off of SparseGPT's Hessians and solves (H100 peak 67).
        disk_gbps: Read and write rate of the checkpoint, cache and export directory.
        process_host_bytes: Peak RSS of one ``train.py`` process before any model-dependent tensor. CPU: measured
            (see :data:`CPU_HOST`); GPU: 3 GiB, the CPU figure plus the CUDA libraries and context (not measured).
        process_device_bytes: GPU memory of the CUDA context and the caching allocator's slack.
        tokenize_bytes_per_token: Transient host bytes per token while a fast tokenizer encodes a whole text:
            221 measured for WikiText-2 test with the tiny byte tokenizer (1.30 M tokens, +273 MiB peak RSS), 194
            with SmolLM2's (305 k tokens, +56 MiB).
        lm_eval_host_bytes: Host memory lm-eval adds when tasks run: imports and task manager (+107 MiB measured)
            and the tasks' documents and requests (not measured; 512 MiB in all assumed).
        gpus_per_node: GPUs (ranks) per node.
        column_overhead_s: SparseGPT's per-column cost beyond FLOPs (launches and a host sync per column).
        h2d_gbps: Host-to-device copy rate of rank 0 (pageable memory).
        broadcast_gbps: NCCL broadcast rate between the node's GPUs (NVLink).
    """

    kind: str = "gpu"
    device_gib: float | None = 80.0
    host_gib: float | None = None
    train_tflops: float = 300.0
    eval_tflops: float = 300.0
    prune_fp32_tflops: float = 50.0
    disk_gbps: float = 2.0
    process_host_bytes: int = 3 * GIB
    process_device_bytes: int = 1 * GIB
    tokenize_bytes_per_token: int = 221
    lm_eval_host_bytes: int = 512 * MIB
    gpus_per_node: int = 8
    column_overhead_s: float = 100e-6
    h2d_gbps: float = 10.0
    broadcast_gbps: float = 100.0

    @property
    def device_bytes(self) -> int | None:
        """Memory of one GPU in bytes (``None`` on CPU)."""
        return None if self.device_gib is None or self.kind == "cpu" else int(self.device_gib * GIB)

    @property
    def host_bytes(self) -> int | None:
        """Host memory of one node in bytes (``None``: not checked)."""
        return None if self.host_gib is None else int(self.host_gib * GIB)


GPU_NODE = Hardware()
"""An 8 x H100 80 GB node (throughputs assumed, see :class:`Hardware`)."""

CPU_HOST = Hardware(kind="cpu", device_gib=None, train_tflops=0.05, eval_tflops=0.05, prune_fp32_tflops=0.05,
                    disk_gbps=1.0, process_host_bytes=590 * MIB, process_device_bytes=0)
"""This project's CPU machine (2 cores). ``process_host_bytes``: 590 MiB, the peak RSS of
``python train.py experiment=tiny_smoke eval=none dense_ppl=false pruned_ppl=false sample.enabled=false`` (587 MiB
measured with torch 2.13.0+cpu, transformers 5.24, lightning 2.6.6; the tiny model's own tensors are below 1 MiB).
``train_tflops``: 50 GFLOP/s, the order of a fp32 matmul on 2 cores (time on a CPU is a rough guide only)."""


def for_accelerator(kind: str) -> Hardware:
    """:data:`GPU_NODE` or :data:`CPU_HOST`."""
    return CPU_HOST if kind == "cpu" else GPU_NODE
