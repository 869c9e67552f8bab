"""``python -m spp.pruning.cache list|clear [--cache-dir DIR] [--match TEXT]``: inspect or empty the cache."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from spp.pruning.cache.store import CorruptEntryError, entry_size, list_entries, read_manifest, remove_entry


def default_cache_dir() -> Path:
    """``$SPP_CACHE_DIR`` or ``~/.cache/spp`` (the ``cache_dir`` config default)."""
    return Path(os.environ.get("SPP_CACHE_DIR", Path.home() / ".cache" / "spp"))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m spp.pruning.cache", description=__doc__)
    parser.add_argument("command", choices=["list", "clear"])
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--match", default="", help="only entries whose path contains this text")
    args = parser.parse_args(argv)
    entries = [e for e in list_entries(args.cache_dir) if args.match in str(e)]
    if args.command == "list":
        if not entries:
            print(f"no pruning cache entries under {args.cache_dir}")
        for entry in entries:
            try:
                manifest = read_manifest(entry)
                overall = manifest.get("overall", {})
                status = f"sparsity {overall.get('sparsity', float('nan')):.4f}, created {manifest.get('created')}"
            except CorruptEntryError:
                status = "INCOMPLETE (will be rebuilt)"
            print(f"{entry.relative_to(args.cache_dir)}  {entry_size(entry) / 2**20:.1f} MiB  {status}")
        return 0
    for entry in entries:
        remove_entry(entry)
    print(f"removed {len(entries)} pruning cache entr{'y' if len(entries) == 1 else 'ies'} from {args.cache_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
