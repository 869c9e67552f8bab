"""What a run writes follows the user's umask (files ``0666 & ~umask``, folders
``0777 & ~umask``), so on a shared cluster a merged model is as readable as any other file the user makes.

``save_pretrained`` writes its safetensors through a 0600 temporary file; without :func:`spp.atomic.follow_umask`
the merged model's weights were owner-only whatever the umask.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from train_helpers import tiny_job

from spp.adapters.registry import apply_adapter, get_method
from spp.atomic import write_dir_atomic
from spp.distributed import DistContext
from spp.export.manifest import ExportManifest
from spp.export.merged import ExportInputs, export_streamed
from spp.models.tiny import tiny_llama
from train import run_job


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set the process umask for the test (restored afterwards)."""
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """``{relative path: permission bits}`` of ``root`` and everything under it (links left out)."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        if not path.is_symlink():
            out[path.relative_to(root).as_posix()] = stat.S_IMODE(path.stat().st_mode)
    return out


def assert_follow(root: Path, mask: int) -> None:
    """Every file under ``root`` is ``0666 & ~mask``, every folder ``0777 & ~mask``."""
    wrong = {name: oct(mode) for name, mode in modes(root).items()
             if mode != ((0o777 if (root / name).is_dir() else 0o666) & ~mask)}
    assert not wrong, (oct(mask), wrong)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002], ids=["022", "077", "002"])
def test_merged_and_adapter_exports_follow_the_umask(mask, umask, tmp_path, tiny_tok):
    umask(mask)
    job = tiny_job(tmp_path)
    model, _ = apply_adapter(tiny_llama(seed=0), job.adapter, None)
    manifest = ExportManifest(adapter={"name": "spp"}, dtype="torch.float32", pruning={})
    merged_dir = export_streamed(model, ExportInputs(get_method("spp"), None, tiny_tok, manifest), tmp_path / "merged",
                                 DistContext()).path
    assert (merged_dir / "model.safetensors.index.json").is_file() and (merged_dir / "spp_export.json").is_file()
    assert_follow(merged_dir, mask)
    adapter_dir = write_dir_atomic(tmp_path / "adapter", lambda tmp: get_method("spp").save(model, tmp, {}))
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert_follow(adapter_dir, mask)


def test_every_file_of_a_run_follows_the_umask(umask, tmp_path):
    """A whole tiny run under umask 022: run folder (summary, config, adapter, merged model, checkpoints, logs)
    and the pruning / perplexity caches are 0644 files in 0755 folders."""
    umask(0o022)
    run_job(tiny_job(tmp_path, "trainer.checkpoint_every_n_steps=3"))
    assert list((tmp_path / "run" / "merged").glob("model-*.safetensors"))
    assert list((tmp_path / "cache" / "pruning").rglob("manifest.json"))
    assert_follow(tmp_path / "run", 0o022)
    assert_follow(tmp_path / "cache", 0o022)
