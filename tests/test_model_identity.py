"""Model files are identified by content (``spp.models.loading.model_identity``): a weights file replaced by one
with other weights, the same size and the same mtime (``cp -p``) is another model for the pruning and perplexity
caches; the same files, or a copy elsewhere, are the same model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import spp.models.loading as loading
from spp.models import ModelConfig, load_model, model_identity, tiny_llama
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.phase import get_or_reconstruct
from tests.test_cache_keys import weights_key

MAGNITUDE = PrunerConfig(name="magnitude")
U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)


def _save(directory: Path, seed: int, tok) -> Path:
    tiny_llama(seed=seed).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def _replace_keeping_size_and_mtime(target: Path, source: Path) -> None:
    """``cp -p source target``: other bytes, written in place, with the target's old timestamps put back."""
    before = target.stat()
    assert source.stat().st_size == before.st_size
    shutil.copyfile(source, target)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _prune(cfg: ModelConfig, cache: Path):
    model, tok = load_model(cfg)
    return get_or_reconstruct(model, tok, cfg, MAGNITUDE, U50, CalibrationConfig(), ReconstructConfig(), cache, None,
                              "cpu")[0]


@pytest.mark.parametrize("whole_file_bytes", [loading.WHOLE_FILE_BYTES, 0], ids=["hashed-whole", "sampled"])
def test_replaced_weights_with_same_size_and_mtime_are_another_model(tmp_path, tiny_tok, monkeypatch,
                                                                     whole_file_bytes):
    monkeypatch.setattr(loading, "WHOLE_FILE_BYTES", whole_file_bytes)  # 0: the safetensors sampling path
    model_dir = _save(tmp_path / "model", 0, tiny_tok)
    other = _save(tmp_path / "other", 1, tiny_tok)
    cfg, cache = ModelConfig(name="local", path=str(model_dir)), tmp_path / "cache"
    first = _prune(cfg, cache)
    assert not first.cache_hit
    identity = model_identity(cfg)
    assert model_identity(cfg) == identity and _prune(cfg, cache).cache_hit  # the same file: a hit
    copy = shutil.copytree(model_dir, tmp_path / "elsewhere")
    assert model_identity(ModelConfig(name="local", path=str(copy))) == identity  # content, not the path
    _replace_keeping_size_and_mtime(model_dir / "model.safetensors", other / "model.safetensors")
    assert model_identity(cfg) != identity
    assert weights_key(cfg) != identity  # the dense perplexity cache keys on it too
    again = _prune(cfg, cache)
    assert not again.cache_hit and again.cache_path != first.cache_path


def test_large_files_are_read_only_in_part(tmp_path, monkeypatch):
    """A GGUF-like file past the whole-file size: its head, tail and spread slices are read, not all of it; a
    change in the middle of the data is still seen when it covers a slice."""
    monkeypatch.setattr(loading, "WHOLE_FILE_BYTES", 2**20)
    path = tmp_path / "model.gguf"
    data = bytearray(os.urandom(24 * 2**20))
    path.write_bytes(data)
    reads: list[int] = []
    real_open = Path.open

    def counting_open(self, *args, **kwargs):
        fh = real_open(self, *args, **kwargs)
        read = fh.read
        fh.read = lambda n=-1: (reads.append(n), read(n))[1]  # type: ignore[method-assign]
        return fh

    monkeypatch.setattr(Path, "open", counting_open)
    before = loading.file_fingerprint(path)
    assert sum(reads) <= 7 * 2**20
    data[12 * 2**20: 13 * 2**20] = os.urandom(2**20)  # a rewritten megabyte of weights
    path.write_bytes(data)
    assert loading.file_fingerprint(path) != before
