"""``python -m spp.pruning.cache list|clear [--cache-dir DIR] [--kind all|pruning|ppl] [--match TEXT]``.
Lists the pruning and perplexity caches one line per entry; ``clear`` removes exactly what ``list`` shows."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spp.paths import default_cache_dir
from spp.pruning.cache.store import CorruptEntryError, entry_size, list_entries, read_manifest, remove_entry
from spp.report_text import interval_text


@dataclass
class Entry:
    """One cache entry as ``list`` shows it."""

    kind: str
    path: Path
    size: int
    status: str
    made_from: str

    def text(self, root: Path) -> str:
        """Two lines: path, size and status; then what it was made from."""
        return f"{self.path.relative_to(root)}  {_size(self.size)}  {self.status}\n    made from: {self.made_from}"


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _pruning_made_from(key: dict[str, Any]) -> str:
    pruner = key.get("pruner", {})
    sparsity = key.get("sparsity", {})
    cal = key.get("calibration", {})
    pattern = (f"{sparsity.get('n')}:{sparsity.get('m')}" if sparsity.get("kind") == "nm"
               else f"{sparsity.get('kind')} {sparsity.get('ratio')}")
    data = (f"{cal.get('nsamples')} × {cal.get('seqlen')} tokens of {cal.get('path') or cal.get('source')} "
            f"(sha256 {str(cal.get('file_sha256') or '')[:12]}, seed {cal.get('seed')})" if cal else "no calibration")
    extra = {k: v for k, v in pruner.items() if k not in ("name", "targets")}
    return (f"model {key.get('model')}, pruner {pruner.get('name')} {extra or ''}".rstrip() +
            f", pattern {pattern}, calibration {data}, code version {key.get('code_version')}")


def _reconstruction_made_from(key: dict[str, Any]) -> str:
    rec = key.get("reconstruct", {})
    options = f" {rec['form_options']}" if rec.get("form_options") else ""
    return (f"reconstruction of the pruning entry with key {str(key.get('pruning'))[:16]}: form {rec.get('form')}"
            f"{options}, {rec.get('loss')} from {rec.get('inputs')} inputs, "
            f"{rec.get('nsamples')} × {rec.get('seqlen')} tokens of {rec.get('path') or rec.get('source')} "
            f"(sha256 {str(key.get('file_sha256') or '')[:12]}, seed {rec.get('seed')}), {rec.get('epochs')} epochs "
            f"lr {rec.get('lr')}, code version {key.get('code_version')}")


def _status(manifest: dict[str, Any]) -> str:
    if "blocks" in manifest:  # a reconstruction entry
        blocks = manifest["blocks"]
        end = sum(b["loss_end"] for b in blocks) / max(1, len(blocks))
        return f"{len(blocks)} blocks reconstructed (mean end loss {end:.4g}), created {manifest.get('created')}"
    overall = manifest.get("overall", {})
    return f"sparsity {overall.get('sparsity', float('nan')):.4f}, created {manifest.get('created')}"


def pruning_entries(cache_dir: Path) -> list[Entry]:
    """The pruning cache's entries."""
    out = []
    for path in list_entries(cache_dir):
        try:
            manifest = read_manifest(path)
            status = _status(manifest)
            key = manifest.get("key", {})
            made = _reconstruction_made_from(key) if "reconstruct" in key else _pruning_made_from(key)
        except CorruptEntryError:
            status, made = "INCOMPLETE (will be rebuilt)", "unknown"
        out.append(Entry("pruning", path, entry_size(path), status, made))
    return out


def ppl_entries(cache_dir: Path, pruning: list[Entry]) -> list[Entry]:
    """The perplexity cache's entries; a pruned model's weights are named by its pruning entry when it exists."""
    root = Path(cache_dir) / "ppl"
    if not root.is_dir():
        return []
    by_digest = {p.path.name.rsplit("-", 1)[-1]: str(p.path.relative_to(cache_dir)) for p in pruning}
    out = []
    for path in sorted(root.glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            out.append(Entry("ppl", path, path.stat().st_size, "UNREADABLE (measured again when needed)", "unknown"))
            continue
        interval = interval_text(result.get("ci_low"), result.get("ci_high"))
        status = (f"ppl {result.get('ppl', float('nan')):.2f}{interval} on {result.get('source')}, seqlen "
                  f"{result.get('seqlen')} × {result.get('windows')} windows")
        key = result.get("made_from")
        if key:
            weights = str(key.get("weights"))
            named = next((entry for digest, entry in by_digest.items() if weights.startswith(digest)), None)
            dense = named is None and "-" in weights
            note = " (dense)" if dense else "" if named else " (pruning entry gone)"
            made = (f"weights {named or weights}{note}" +
                    f", batch {key.get('batch_size')}, max_windows {key.get('max_windows')}, reader "
                    f"{key.get('reader')} (sha256 {str(key.get('file_sha256'))[:12]}), version {key.get('version')}")
        else:
            made = "not recorded (entry written before made_from was stored)"
        out.append(Entry("ppl", path, path.stat().st_size, status, made))
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m spp.pruning.cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["list", "clear"])
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--kind", choices=["all", "pruning", "ppl"], default="all", help="which cache")
    parser.add_argument("--match", default="", help="only entries whose path or description contains this text")
    args = parser.parse_args(argv)
    root = args.cache_dir
    pruning = pruning_entries(root)
    entries = (pruning if args.kind in ("all", "pruning") else []) + (
        ppl_entries(root, pruning) if args.kind in ("all", "ppl") else [])
    entries = [e for e in entries if args.match in str(e.path) or args.match in e.status or args.match in e.made_from]
    if args.command == "list":
        if not entries:
            print(f"no cache entries under {root}" + (f" matching {args.match!r}" if args.match else ""))
        for kind in ("pruning", "ppl"):
            chosen = [e for e in entries if e.kind == kind]
            if chosen:
                total = _size(sum(e.size for e in chosen))
                print(f"== {kind} cache: {len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'}, {total} ==")
                for entry in chosen:
                    print(entry.text(root))
        return 0
    for entry in entries:
        if entry.kind == "pruning":
            remove_entry(entry.path)
        else:
            entry.path.unlink(missing_ok=True)
    counts = {k: sum(e.kind == k for e in entries) for k in ("pruning", "ppl")}
    print(f"removed {counts['pruning']} pruning and {counts['ppl']} perplexity cache entries from {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
