"""Run the architecture matrix (``lab.bench.architectures.CELLS``: 8 families x every pruner, training adapter and
pattern, pairwise) and write its raw records and the README's "Supported models" table.

    python benchmarks/architectures.py      # about a minute on 2 CPU cores: docs/results/architectures.json + README

A cell that fails is recorded with its one-line error and shown as such in the table (the default test suite runs
the same cells and fails instead: ``tests/test_architectures.py``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "docs" / "results" / "architectures.json"
BEGIN, END = "<!-- supported-models:begin -->\n", "<!-- supported-models:end -->\n"


def main() -> None:
    """Every cell in this process, then the JSON and the README table."""
    import torch
    import transformers

    from lab.bench.architectures import CELLS, run_cell, supported_table
    from lab.bench.common import write_committed
    from spp.paths import SAMPLE_DATA_DIR

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, cell in enumerate(CELLS):
            try:
                records.append(run_cell(*cell, Path(tmp) / str(k), str(SAMPLE_DATA_DIR)))
            except Exception as err:  # noqa: BLE001 - a failing cell is a row of the table, not the end of the run
                family, pruner, pattern, adapter = cell
                records.append({"family": family, "pruner": pruner, "pattern": pattern, "adapter": adapter,
                                "ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"})
            print(f"{k + 1}/{len(CELLS)} {'-'.join(cell)}: {'ok' if records[-1]['ok'] else records[-1]['error']}",
                  file=sys.stderr)
    machine = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
               "load_avg": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__,
               "transformers": transformers.__version__}
    text = json.dumps({"command": "python benchmarks/architectures.py", "machine": machine, "cells": records},
                      indent=1) + "\n"
    write_committed(JSON_PATH, text, ROOT / "README.md", BEGIN, END, supported_table(records))


if __name__ == "__main__":
    main()
