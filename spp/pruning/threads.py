"""Single-threaded sections for loops of many tiny tensor ops on CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_cpu_thread(device: torch.device | str) -> Iterator[None]:
    """Run the enclosed code with one intra-op thread when ``device`` is a CPU.

    SparseGPT's column loop and DS⊘T's cycles are thousands of tiny ops; on 2 shared cores two threads took 20 s
    against 0.6 s with one (a 1536 x 576 matrix)."""
    if torch.device(device).type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
