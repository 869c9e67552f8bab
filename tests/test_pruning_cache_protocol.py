"""The pruning cache's protocol at scale: written while pruning runs, read once, and no rank
left waiting on the training process group while rank 0 works alone.

* SparseGPT's entry is streamed: each decoder block's weights file is handed to the writer as soon as the block is
  final, before the next block is onloaded; the manifest records each file's sha256 of the bytes written.
* A hit reads every weights file once (checksum and tensors from the same bytes); only the small masks file is
  hashed before anything is applied. A weights file found corrupt after earlier blocks were applied ends the job
  in one line and removes the entry; the re-run prunes afresh.
* A full disk while writing removes the unfinished entry and ends *every* rank with one line; a SparseGPT solve
  that fails on the rank owning the matrix ends every rank with its message.
* Rank 0 loading the weights and finishing the entry for longer than the process-group timeout: the other ranks
  wait on the job's wait group and the job finishes (negative control: without the wait group it times out).
* A finished pruning or reconstruction entry that rank 0 finds corrupt mid-apply ends every rank at once, in rank 0's
  line (the waiting ranks hear of it over the wait group, not from its timeout).
* A job spanning nodes whose file locks are node-local (Lustre ``localflock``) is refused in one line on every
  rank; coherent locks pass.
"""

from __future__ import annotations

import errno
import hashlib
import json
import textwrap
from pathlib import Path

import pytest
import torch

import spp.pruning.cache.store as store
from spp.errors import UserError
from spp.models.config import ModelConfig
from spp.models.offload import OffloadedModel
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.phase import get_or_reconstruct
from tests.test_pruning_distributed import torchrun

ARCH = {"num_hidden_layers": 3}
CFG = ModelConfig(name="tiny", path="tiny", arch=ARCH)
CAL = CalibrationConfig(nsamples=8, seqlen=64, batch_size=2)
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
SPARSEGPT = PrunerConfig(name="sparsegpt")


def _prune(cache: Path) -> tuple[torch.nn.Module, object]:
    model = tiny_llama(seed=0, **ARCH)
    result, _ = get_or_reconstruct(model, tiny_tokenizer(), CFG, SPARSEGPT, NM24, CAL, ReconstructConfig(), cache,
                                   SAMPLE_DATA_DIR, "cpu")
    return model, result


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sparsegpt_entry_is_streamed_block_by_block_and_its_checksums_are_of_the_bytes_on_disk(tmp_path,
                                                                                              monkeypatch):
    events: list[tuple[str, str]] = []
    onload, add = OffloadedModel.onload, store.EntryWriter.add_weights

    def spy_onload(self, names, device=None):
        names = list(names)
        blocks = {n.split(".")[2] for n in names if n.startswith("model.layers.")}
        events.extend(("onload", b) for b in sorted(blocks))
        return onload(self, names, device)

    def spy_add(self, group):
        events.append(("write", next(iter(group)).split(".")[2]))
        return add(self, group)

    monkeypatch.setattr(OffloadedModel, "onload", spy_onload)
    monkeypatch.setattr(store.EntryWriter, "add_weights", spy_add)
    pruned, result = _prune(tmp_path / "cache")
    assert not result.cache_hit
    writes = [b for kind, b in events if kind == "write"]
    assert writes == ["0", "1", "2"]
    for block in ("0", "1"):  # block k is handed over before block k + 1 is onloaded for pruning
        assert events.index(("write", block)) < events.index(("onload", str(int(block) + 1)))
    entry = Path(result.cache_path)
    manifest = json.loads((entry / store.MANIFEST_FILE).read_text())
    assert sorted(manifest["files"]) == [store.STATE_FILE, *(f"weights-{k:05d}.safetensors" for k in range(3))]
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((entry / name).read_bytes()).hexdigest() == digest
    monkeypatch.undo()
    again, hit = _prune(tmp_path / "cache")
    assert hit.cache_hit
    expected = _weights(pruned)
    assert all(torch.equal(v, expected[k]) for k, v in _weights(again).items())


def test_a_hit_reads_each_weights_file_once_and_hashes_only_the_masks_first(tmp_path, monkeypatch):
    _, result = _prune(tmp_path / "cache")
    entry = Path(result.cache_path)
    reads: list[str] = []
    hashed: list[str] = []
    read_bytes, file_sha256 = Path.read_bytes, store.file_sha256

    def spy_read(self):
        if self.parent == entry:
            reads.append(self.name)
        return read_bytes(self)

    def spy_hash(path, *args, **kwargs):
        if Path(path).parent == entry:
            hashed.append(Path(path).name)
        return file_sha256(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", spy_read)
    monkeypatch.setattr(store, "file_sha256", spy_hash)
    _, hit = _prune(tmp_path / "cache")
    assert hit.cache_hit
    assert sorted(reads) == [f"weights-{k:05d}.safetensors" for k in range(3)]  # once each
    assert hashed == [store.STATE_FILE]


def test_a_weights_file_found_corrupt_mid_apply_ends_in_one_line_and_the_rerun_prunes_afresh(tmp_path):
    pruned, result = _prune(tmp_path / "cache")
    entry = Path(result.cache_path)
    bad = entry / "weights-00001.safetensors"
    data = bytearray(bad.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit pattern inside a tensor: still decodable, wrong checksum
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError) as caught:
        _prune(tmp_path / "cache")
    line = str(caught.value)
    assert "weights-00001.safetensors fails its sha256 checksum" in line and "run the job again" in line
    assert "\n" not in line
    assert not entry.exists()
    again, rerun = _prune(tmp_path / "cache")
    assert not rerun.cache_hit
    expected = _weights(pruned)
    assert all(torch.equal(v, expected[k]) for k, v in _weights(again).items())


def test_a_full_disk_while_streaming_leaves_no_entry(tmp_path, monkeypatch):
    write = store._atomic_write_bytes

    def full(path, data):
        if path.name == "weights-00001.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(path, data)

    monkeypatch.setattr(store, "_atomic_write_bytes", full)
    with pytest.raises(UserError, match="disk filled up while writing the pruning cache entry"):
        _prune(tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache" / "pruning").rglob("*") if p.is_dir() and "sparsegpt" in p.name]


RANKS = """
import json, socket, sys, time, torch, torch.distributed as dist
from datetime import timedelta
import spp.pruning.cache.lock as lock
import spp.pruning.cache.store as store
import spp.training.callbacks.pruning as phase
from spp.distributed import DistContext
from spp.errors import UserError
from spp.models.config import ModelConfig
from spp.models.tiny import tiny_tokenizer
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig

torch.set_num_threads(1)
mode, out, cache, slow_s, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
ctx = DistContext.current("cpu")
settings = phase.PruningSettings(ModelConfig(name="tiny", path="tiny", arch={"num_hidden_layers": 3}),
                                 PrunerConfig(name="sparsegpt"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                                 CalibrationConfig(nsamples=8, seqlen=64, batch_size=2), cache,
                                 __import__("spp.paths").paths.SAMPLE_DATA_DIR)
row = {"rank": ctx.rank}

def slow(fn):
    def wrapped(*args, **kwargs):
        if ctx.is_main:
            time.sleep(slow_s)  # rank 0 alone: a 70B checkpoint read, an entry's last files written
        return fn(*args, **kwargs)
    return wrapped

if mode in ("slow", "slow-without-wait-group"):
    phase.load_for_rank = slow(phase.load_for_rank)
    store.EntryWriter.finish = slow(store.EntryWriter.finish)
    if mode == "slow-without-wait-group":
        DistContext.allow_long_waits = lambda self, timeout_s: None
    start = time.perf_counter()
    pruned = phase.prune_phase(settings, None, tiny_tokenizer(), ctx, everywhere=True)
    row["seconds"] = time.perf_counter() - start
    row["sum"] = float(sum(p.double().abs().sum() for p in pruned.model.parameters()))
elif mode == "disk-and-locks":
    write = store._atomic_write_bytes
    def full(path, data):
        if path.name == "weights-00001.safetensors":
            raise OSError(28, "No space left on device")
        return write(path, data)
    store._atomic_write_bytes = full
    try:
        phase.prune_phase(settings, None, tiny_tokenizer(), ctx)
        row["disk"] = "finished"
    except UserError as err:
        row["disk"] = str(err)
    store._atomic_write_bytes = write
    if ctx.rank == 1:  # another node, whose locks are coherent with rank 0's (one machine): passes
        socket.gethostname = lambda: "node-b"
    lock.check_locks_span_nodes(ctx, __import__("pathlib").Path(cache) / "coherent")
    row["coherent"] = "passed"
    if ctx.rank == 1:  # ... and one whose lock manager does not see rank 0's lock (Lustre localflock)
        lock.fcntl.flock = lambda fd, op: None
    try:
        lock.check_locks_span_nodes(ctx, __import__("pathlib").Path(cache) / "localflock")
        row["localflock"] = "passed"
    except UserError as err:
        row["localflock"] = str(err)
    import spp.pruning.pruners.sparsegpt.rule as methods
    solve = methods.sparsegpt_prune
    def failing(weight, *args, **kwargs):  # a Hessian that is not positive definite, on the owner of one matrix
        if ctx.rank == 1 and weight.shape[0] == weight.shape[1]:
            raise ValueError("Hessian is not positive definite; increase pruner.percdamp")
        return solve(weight, *args, **kwargs)
    methods.sparsegpt_prune = failing
    try:
        phase.prune_phase(settings, None, tiny_tokenizer(), ctx)
        row["owner"] = "finished"
    except ValueError as err:
        row["owner"] = str(err)
elif mode == "corrupt":  # a finished entry found corrupt mid-apply by rank 0: every rank ends at once, in its line
    import pathlib
    import spp.pruning.cache as cache_module
    import spp.pruning.reconstruction.phase as recon_phase
    from spp.pruning.reconstruction.config import ReconstructConfig
    for module in (phase, cache_module, recon_phase):  # the wait group times out after a quarter of timeout_s
        module.READ_MARGIN_S = 0.0
    settings.lock_timeout_s = timeout_s / 4
    settings.reconstruct = ReconstructConfig(name="blockwise", form="spp", nsamples=4, seqlen=64, epochs=1,
                                             batch_size=2)
    phase.prune_phase(settings, None, tiny_tokenizer(), ctx)  # writes both entries
    for which in ("sparsegpt-nm2_4-" + "?" * 16, "*-blockwise-*"):  # the pruning entry, then the reconstruction's
        if ctx.is_main:
            (entry,) = [p for p in pathlib.Path(cache).glob(f"pruning/*/{which}") if p.is_dir()]
            bad = sorted(entry.glob("weights-*.safetensors"))[-1]
            data = bad.read_bytes()
            bad.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))  # decodable, fails its sha256
        dist.barrier()
        start = time.perf_counter()
        try:
            phase.prune_phase(settings, None, tiny_tokenizer(), ctx)
            row[which] = "finished"
        except Exception as err:  # noqa: BLE001 - the unfixed rank 1 ends in the wait group's timeout
            row[which] = f"{type(err).__name__}: {err}"
        row[which + " seconds"] = time.perf_counter() - start
elif mode == "missing-calibration":  # rank 0 alone hashes the calibration file for the key: every rank learns
    import dataclasses
    import spp.pruning.cache as cache_module
    from spp.models.tiny import tiny_llama
    from spp.pruning.reconstruction.config import ReconstructConfig
    from spp.pruning.reconstruction.phase import get_or_reconstruct
    cache_module.READ_MARGIN_S = 0.0  # the wait group times out after a quarter of timeout_s
    missing = dataclasses.replace(settings.calibration, path="no-such-calibration.jsonl")
    for which, recon in (("prune", ReconstructConfig()),  # prune_cached's key, then the reconstruction probe's
                         ("probe", ReconstructConfig(name="blockwise", form="spp", nsamples=4, seqlen=64))):
        start = time.perf_counter()
        try:
            get_or_reconstruct(tiny_llama(seed=0, num_hidden_layers=3), tiny_tokenizer(), settings.model,
                               settings.pruner, settings.sparsity, missing, recon, cache, settings.data_dir,
                               ctx=ctx, lock_timeout_s=timeout_s / 4)
            row[which] = "finished"
        except Exception as err:  # noqa: BLE001 - the unfixed rank 1 ends in the wait group's timeout
            row[which] = f"{type(err).__name__}: {err}"
        row[which + " seconds"] = time.perf_counter() - start
    blocked = __import__("pathlib").Path(cache) / "blocked"  # a file where rank 0 makes the lock probe's folder
    if ctx.is_main:
        blocked.parent.mkdir(parents=True, exist_ok=True)
        blocked.write_text("not a folder")
    dist.barrier()
    if ctx.rank == 1:  # another node: rank 0 takes the probe's lock alone
        socket.gethostname = lambda: "node-b"
    start = time.perf_counter()
    try:
        lock.check_locks_span_nodes(ctx, blocked / "pruning")
        row["spanning"] = "passed"
    except Exception as err:  # noqa: BLE001 - the unfixed rank 1 ends in the wait group's timeout
        row["spanning"] = f"{type(err).__name__}: {err}"
    row["spanning seconds"] = time.perf_counter() - start
dist.barrier()
with open(f"{out}.rank{ctx.rank}.json", "w") as fh:
    json.dump(row, fh)
dist.destroy_process_group()
"""


def _ranks(tmp_path: Path, mode: str, slow_s: float = 0.0, timeout_s: float = 60.0):
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(RANKS))
    proc = torchrun(script, 2, mode, str(tmp_path / mode), str(tmp_path / f"cache-{mode}"), str(slow_s),
                    str(timeout_s), timeout=300)
    rows = [json.loads(p.read_text()) for p in sorted(tmp_path.glob(f"{mode}.rank*.json"))]
    return proc, rows


@pytest.mark.slow  # two torchrun jobs that sleep past their timeout by design (43 s)
def test_rank_zero_loading_and_writing_past_the_process_group_timeout(tmp_path):
    slow_s, timeout_s = 8.0, 5.0
    proc, rows = _ranks(tmp_path, "slow", slow_s, timeout_s)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["seconds"] >= 2 * slow_s for r in rows)  # both waits happened, each past the timeout
    assert rows[0]["sum"] == rows[1]["sum"]  # and rank 1 holds rank 0's pruned weights
    control, _ = _ranks(tmp_path, "slow-without-wait-group", slow_s, timeout_s)
    assert control.returncode != 0
    assert "timed out" in (control.stdout + control.stderr).lower() or "timeout" in control.stderr.lower()


@pytest.mark.slow  # three multi-rank runs (12 s); CI runs it
def test_a_full_disk_a_failed_owner_solve_and_node_local_locks_end_every_rank(tmp_path):
    proc, rows = _ranks(tmp_path, "disk-and-locks")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert len(rows) == 2
    for row in rows:
        assert "disk filled up while writing the pruning cache entry" in row["disk"], row
        assert row["coherent"] == "passed"
        assert "file locks do not reach across nodes" in row["localflock"] and "node-b" in row["localflock"]
        assert "\n" not in row["localflock"]
        assert "not positive definite" in row["owner"], row  # rank 1 owns the failing matrix; rank 0 learns of it
    assert not [p for p in (tmp_path / "cache-disk-and-locks" / "pruning").rglob("*")
                if p.is_dir() and "sparsegpt" in p.name]


@pytest.mark.slow  # one two-process run writing and reading both entries (25 s); CI runs it
def test_a_corrupt_entry_met_by_rank_zero_ends_every_rank_at_once_in_its_line(tmp_path):
    """Rank 0 finds a weights file of a finished pruning entry, then of a reconstruction entry, corrupt after part of
    it was applied: every rank ends with rank 0's one line within seconds, not after the wait group's timeout
    (``timeout_s / 4``, the negative control: a rank left waiting for rank 0's decision takes that long)."""
    timeout_s = 60.0
    proc, rows = _ranks(tmp_path, "corrupt", timeout_s=timeout_s)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert len(rows) == 2
    for which, line in (("sparsegpt-nm2_4-" + "?" * 16, "found after part of the entry was applied"),
                        ("*-blockwise-*", "failed its checks while it was read")):
        assert rows[0][which].startswith("UserError: ") and line in rows[0][which], rows[0]
        assert "\n" not in rows[0][which]
        assert rows[1][which] == rows[0][which], rows  # the same line on the waiting rank
        assert rows[1][which + " seconds"] < timeout_s / 6, rows  # not the wait group's timeout (timeout_s / 4)


@pytest.mark.slow  # one two-process run (about 10 s fixed; the unfixed code waits out two timeouts)
def test_a_key_rank_zero_cannot_compute_ends_every_rank_at_once_in_its_line(tmp_path):
    """Rank 0 alone computes the pruning cache key (``prune_cached``) and the reconstruction's (``probe``), hashing
    the calibration file: a missing file ends every rank at once with rank 0's error, not the waiting ranks in the
    wait group's timeout (``timeout_s / 4``, the negative control). The same for the lock probe rank 0 makes alone in
    a job spanning nodes (``check_locks_span_nodes``) under a cache_dir it cannot write."""
    timeout_s = 60.0
    proc, rows = _ranks(tmp_path, "missing-calibration", timeout_s=timeout_s)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert len(rows) == 2
    for which in ("prune", "probe", "spanning"):
        assert rows[0][which].startswith(("FileNotFoundError: ", "FileExistsError: ", "NotADirectoryError: ")), rows
        assert ("no-such-calibration" if which != "spanning" else "blocked") in rows[0][which], rows
        assert rows[1][which] == rows[0][which], rows  # the same error on the waiting rank
        assert rows[1][which + " seconds"] < timeout_s / 6, rows  # not the wait group's timeout (timeout_s / 4)
