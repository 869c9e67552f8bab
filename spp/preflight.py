"""Checks that run before any weight is loaded (``docs/errors.md``): every shape rule, data file and resume
setting a job will need, read from the model's ``config.json`` / GGUF header / ``arch`` block alone.

Each failed check raises :class:`spp.errors.UserError` naming the config key and the fix; ``cli_errors`` prints
it as one line. A check that passes here cannot fail hours later inside pruning or training.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from spp.adapters.registry import get_method
from spp.atomic import check_writable_dir
from spp.data.config import HUB_PREFIX
from spp.data.records import load_alpaca_records
from spp.deepspeed_support import check_deepspeed, check_resume_format
from spp.errors import UserError, user_file
from spp.eval.perplexity import source_file
from spp.models.config import ModelConfig
from spp.models.loading import TOKENIZER_FILES, has_tokenizer_files, resolve_source
from spp.models.tiny import TINY_ARCH
from spp.paths import find_data
from spp.planning.job import check_job
from spp.projections import DEFAULT_TARGETS, matches
from spp.pruning.calibration_data import resolve_calibration_file
from spp.pruning.registry import get_pruner, needs_calibration

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_ARCH_KEYS = {
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "context_length": "max_position_embeddings",
    "attention.key_length": "head_dim",
}


def _fix_model_path(cfg: ModelConfig) -> str:
    return f"point model.path= at a complete model (a directory with config.json and weights, or a .gguf file); " \
           f"now {cfg.path!r}"


# ---------------------------------------------------------------------------------------------------------- model


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise EOFError("file ends inside the GGUF header")
    return struct.unpack(fmt, data)[0]


def _gguf_value(fh: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _GGUF_SCALARS:
        return _read(fh, _GGUF_SCALARS[kind])
    if kind == 8:
        n = _read(fh, "<Q")
        data = fh.read(n)
        if len(data) != n:
            raise EOFError("file ends inside a GGUF string")
        return data.decode("utf-8", errors="replace") if keep else None
    if kind == 9:
        item, count = _read(fh, "<I"), _read(fh, "<Q")
        if item in _GGUF_SCALARS and item != 8:
            fh.seek(count * struct.calcsize(_GGUF_SCALARS[item]), os.SEEK_CUR)
            return None
        for _ in range(count):
            _gguf_value(fh, item, keep=False)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The scalar key/value metadata of a GGUF file's header (arrays such as the vocabulary are skipped).

    Raises:
        ValueError: not a GGUF file (bad magic) or an unknown version; ``EOFError`` / ``struct.error`` when the
        header is cut short.
    """
    with Path(path).open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file (the first 4 bytes are not 'GGUF')")
        version = _read(fh, "<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
        _read(fh, "<Q")  # tensor count
        meta: dict[str, Any] = {}
        for _ in range(_read(fh, "<Q")):
            key = _gguf_value(fh, 8, keep=True)
            meta[key] = _gguf_value(fh, _read(fh, "<I"), keep=True)
    return meta


def check_safetensors(path: Path) -> None:
    """Check a ``.safetensors`` file's header and that the file is as long as the header says (not truncated)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise EOFError(f"{size} bytes: shorter than a safetensors header")
        n = struct.unpack("<Q", head)[0]
        if n > size - 8:
            raise EOFError(f"header of {n} bytes does not fit in the file's {size} bytes")
        header = json.loads(fh.read(n))
    end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise EOFError(f"truncated: the header needs {8 + n + end} bytes, the file has {size}")


def model_arch(cfg: ModelConfig) -> dict[str, Any]:
    """The architecture fields of ``cfg`` (LlamaConfig names) without loading a weight; checks the weight files.

    ``tiny``: its built-in arch plus ``model.arch``; a directory: ``config.json`` (and the safetensors headers); a
    GGUF file: its header; a hub id: ``model.arch`` (may be empty: the shape checks are then skipped).

    Raises:
        UserError: a missing path, a damaged ``config.json``, GGUF header or safetensors file (naming the file).
    """
    try:
        kind, where, gguf_file = resolve_source(cfg)
    except FileNotFoundError as err:
        raise UserError(str(err).split(";")[0], _fix_model_path(cfg), key="model.path") from err
    if kind == "tiny":
        return {**TINY_ARCH, **dict(cfg.arch)}
    if kind == "hub":
        return dict(cfg.arch)
    if gguf_file:
        path = Path(where) / gguf_file
        with user_file(path, "model.path", _fix_model_path(cfg)):
            meta = gguf_metadata(path)
        prefix = f"{meta.get('general.architecture', 'llama')}."
        arch = {name: meta[prefix + key] for key, name in _GGUF_ARCH_KEYS.items() if prefix + key in meta}
        return {**dict(cfg.arch), **arch, "model_type": meta.get("general.architecture", "llama")}
    directory = Path(where)
    with user_file(directory / "config.json", "model.path", _fix_model_path(cfg)):
        arch = json.loads((directory / "config.json").read_text())
        index = directory / "model.safetensors.index.json"
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else []
    files = [directory / s for s in shards] or ([directory / "model.safetensors"]
                                                if (directory / "model.safetensors").is_file() else [])
    for file in files:
        with user_file(file, "model.path", _fix_model_path(cfg)):
            if not file.is_file():
                raise FileNotFoundError(f"shard {file.name} listed in model.safetensors.index.json is missing")
            check_safetensors(file)
    return arch


def linear_shapes(arch: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of the seven projections of a LLaMA decoder block, from its arch fields."""
    hidden, inter = int(arch["hidden_size"]), int(arch["intermediate_size"])
    heads = int(arch["num_attention_heads"])
    kv = int(arch.get("num_key_value_heads") or heads)
    head_dim = int(arch.get("head_dim") or hidden // heads)
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def _targets(targets: list[str]) -> list[str]:
    return [p for p in DEFAULT_TARGETS if matches(f"model.layers.0.{p}", targets) or p in targets]


def check_shapes(arch: dict[str, Any], *, adapter: Any = None, sparsity: Any = None, pruner: Any = None,
                 seqlens: dict[str, int] | None = None) -> None:
    """Every shape rule of the run against the arch: the adapter method's own (:meth:`~spp.adapters.base.
    AdapterMethod.preflight`, e.g. SPP's ``r | out_features``), N:M's ``m | in_features``, the sequence lengths
    within ``max_position_embeddings``."""
    max_pos = arch.get("max_position_embeddings")
    for key, value in (seqlens or {}).items():
        if max_pos is not None and value > int(max_pos):
            raise UserError(f"{key}={value} exceeds the model's max_position_embeddings={max_pos}",
                            f"set {key}<={max_pos}", key=key)
    if not {"hidden_size", "intermediate_size", "num_attention_heads"} <= set(arch):
        if adapter is not None:
            get_method(adapter.name).preflight(adapter, None)
        log.info("preflight: the model's shapes are unknown before loading (hub id without model.arch); "
                 "shape checks run after loading")
        return
    shapes = linear_shapes(arch)
    if adapter is not None:  # the method's own rules (SPP: r divides every out_features)
        get_method(adapter.name).preflight(adapter, {p: shapes[p] for p in _targets(list(adapter.targets))})
    if sparsity is not None and pruner is not None and sparsity.kind == "nm" and pruner.name != "none":
        m = int(sparsity.m)
        bad = {p: shapes[p][0] for p in _targets(list(pruner.targets)) if shapes[p][0] % m}
        if bad:
            name, inp = next(iter(bad.items()))
            raise UserError(f"sparsity.m={m} does not divide in_features={inp} of {name} (N:M groups run along the "
                            "input dimension)", f"choose sparsity.m dividing {inp}, or drop {name} from "
                            "pruner.targets", key="sparsity.m")


@dataclass(frozen=True)
class ArchLayers:
    """The weight layers of an architecture, read from a one-block copy built on the meta device.

    Attributes:
        linears: Qualified names of every ``nn.Linear`` of the model (``lm_head`` included).
        block_linears: Leaf names of the ``nn.Linear`` layers of a decoder block (what ``pruner.targets`` names).
        block_others: The block's other 2-D weight layers as ``"<leaf> (<class>)"`` (GPT-2's ``Conv1D``).
    """

    linears: list[str]
    block_linears: list[str]
    block_others: list[str]


def arch_layers(arch: dict[str, Any]) -> ArchLayers | None:
    """The layers of the architecture ``arch`` (its ``config.json`` fields, ``model_type`` included), from a copy
    with one decoder block built on the meta device: no weight is read or allocated.

    Returns ``None`` when ``arch`` names no ``model_type`` or transformers cannot build it (the layers are then
    checked at load time).
    """
    model_type = arch.get("model_type")
    if not model_type:
        return None
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM

        from spp.pruning.targets import decoder_layers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # config warnings belong to load time, not to this check
        try:
            config = AutoConfig.for_model(model_type, **{k: v for k, v in arch.items() if k != "model_type"})
            config.num_hidden_layers = 1
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        finally:
            transformers.logging.set_verbosity(verbosity)
        _, layers = decoder_layers(model)
    except Exception as err:  # noqa: BLE001 - an architecture transformers cannot build fails at load time instead
        log.info("preflight: cannot build model_type=%s on the meta device (%s); layer checks run after loading",
                 model_type, err)
        return None
    block = list(layers[0].named_modules())
    return ArchLayers(
        linears=[n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)],
        block_linears=sorted({n.rsplit(".", 1)[-1] for n, m in block if isinstance(m, torch.nn.Linear)}),
        block_others=sorted({f"{n.rsplit('.', 1)[-1]} ({type(m).__name__})" for n, m in block
                             if not isinstance(m, (torch.nn.Linear, torch.nn.Embedding))
                             and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2}),
    )


def check_targets(arch: dict[str, Any], path: str, *, pruner: Any = None, sparsity: Any = None,
                  adapter: Any = None) -> None:
    """``pruner.targets`` (leaf names in the decoder blocks) and ``adapter.targets`` (module-name suffixes) each
    match at least one ``nn.Linear`` of the architecture; GPT-2's ``Conv1D`` projections match nothing."""
    layers = arch_layers(arch)
    if layers is None:
        return
    rules = []
    if pruner is not None and pruner.name != "none" and sparsity is not None and not sparsity.is_dense:
        rules.append(("pruner.targets", list(pruner.targets), set(pruner.targets) & set(layers.block_linears)))
    if adapter is not None and get_method(adapter.name).trains:
        rules.append(("adapter.targets", list(adapter.targets),
                      [n for n in layers.linears if matches(n, adapter.targets)]))
    kind = arch.get("model_type")
    for key, targets, found in rules:
        if found:
            continue
        if not layers.block_linears:
            raise UserError(f"model.path={path}: a {kind} model, whose decoder blocks have no nn.Linear layer "
                            f"({', '.join(layers.block_others) or 'no 2-D weight'}), so {key}={targets} matches "
                            "nothing",
                            "use a LLaMA-architecture model (LLaMA, Llama 2, Mistral, Qwen2, SmolLM2: q_proj ... "
                            "down_proj as nn.Linear); GPT-2-style Conv1D models are not supported yet", key=key)
        raise UserError(f"{key}={targets} matches no nn.Linear layer of the {kind} model at model.path={path}",
                        f"set {key} to names among {layers.block_linears}", key=key)


def check_tokenizer_files(cfg: ModelConfig, tokenizer: str | None = None) -> None:
    """``generate.py``: the folder the tokenizer comes from (``tokenizer=``, else ``model.path``) holds tokenizer
    files, checked before the weights load (a merged model copied without them would otherwise fail after
    loading, in words about sentencepiece and tiktoken). GGUF files (the tokenizer is inside), ``tiny`` and hub
    ids are not checked."""
    if tokenizer:
        key, where = "tokenizer", Path(tokenizer).expanduser()
        if not where.is_dir():
            if where.exists() or str(tokenizer).startswith((".", "/", "~")):
                raise UserError(f"tokenizer={tokenizer!r} is not a folder", "point tokenizer= at the folder of the "
                                "model's tokenizer files, or at a hub id", key=key)
            return  # a hub id
    else:
        try:
            kind, location, _ = resolve_source(cfg)
        except FileNotFoundError:
            return  # the model check names a missing model.path
        if kind != "dir":
            return
        key, where = "model.path", Path(location)
    if not has_tokenizer_files(where):
        fix = (f"copy the tokenizer files of the model it was trained from into {where} (e.g. cp <base model>/"
               "tokenizer* <folder>/), or pass tokenizer=<the base model's folder>") if key == "model.path" else \
            "point tokenizer= at the folder of the model's tokenizer files (the base model's folder)"
        raise UserError(f"{key}={str(where)!r} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)})",
                        fix, key=key)


def check_positive(values: dict[str, float]) -> None:
    """Each value finite and > 0 (scales, learning rates)."""
    for key, value in values.items():
        if value is None or not math.isfinite(float(value)) or float(value) <= 0:
            raise UserError(f"{key}={value} must be a finite number > 0", f"set {key} to a positive number",
                            key=key)


# ----------------------------------------------------------------------------------------------------------- data


def check_data_source(source: str, data_dir: str | None, key: str = "data.source") -> int:
    """Read and validate the Alpaca records of ``data.source`` (hub sources are left to load time).

    Returns:
        The number of valid records (0 for a hub source).
    """
    if source.startswith(HUB_PREFIX):
        return 0
    try:
        records = load_alpaca_records(source, data_dir)
    except FileNotFoundError as err:
        raise UserError(f"{key}={source!r}: {str(err).split('; searched')[0]}",
                        f"pass data_dir=<dir holding {source}> or an absolute {key}=", key=key) from err
    except (ValueError, OSError) as err:
        raise UserError(f"{key}={source!r}: {err}", f"fix the file or point {key}= at a good copy", key=key,
                        path=source) from err
    return len(records.records)


def check_data_file(rel: str, data_dir: str | None, key: str) -> Path:
    """Resolve a data file the job will read, as a UserError naming ``key`` and ``data_dir`` when missing."""
    try:
        return find_data(rel, data_dir)
    except FileNotFoundError as err:
        raise UserError(f"{key}: {err}".split(". Pass data_dir")[0],
                        f"pass data_dir=<dir holding {rel}> (a data_dir= given is searched alone, never the "
                        "shipped samples)", key=key) from err


# --------------------------------------------------------------------------------------------------------- resume


RESUME_DATA_KEYS = ("source", "hub_split", "max_length", "add_eos", "train_on_inputs", "val_size", "max_val_fraction",
                    "max_examples", "seed", "train_batch_size", "pad_to_multiple_of", "padding_side", "shuffle")
"""``data.*`` keys that decide which examples a resumed run sees, in which order and batches."""
RESUME_TRAINER_KEYS = ("lr", "weight_decay", "betas", "warmup_ratio", "scheduler", "global_batch_size",
                       "accumulate_grad_batches", "gradient_clip_val")
"""``trainer.*`` keys that decide the optimisation (``max_steps`` / ``max_epochs`` may change: a resume may extend a
run, the schedule then follows the new length)."""


def _plain(obj: Any, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    return {k: (v if isinstance(v, (bool, int, float, list, type(None))) else str(v)) for k, v in vars(obj).items()
            if keys is None or k in keys}


def pruning_settings(job: Any) -> dict[str, dict[str, Any]]:
    """What decides the pruned weights, as ``settings_of`` groups: the model files' content identity
    (``model.weights``), the pruning cache key's pruner and calibration fields (with the calibration file's sha256),
    the pruning code version and the key's digest (``pruning.*``)."""
    from spp.models.loading import model_identity
    from spp.pruning.cache import cache_key

    if job.pruner.name == "none" or job.sparsity.is_dense:
        return {"model": {"weights": model_identity(job.model)}}
    key, digest = cache_key(job.model, job.pruner, job.sparsity, job.calibration, job.data_dir)
    groups = {"model": {"weights": key["model"]}, "pruner": dict(key["pruner"]),
              "pruning": {"code_version": key["code_version"], "cache_key": digest[:16]}}
    if "calibration" in key:
        groups["calibration"] = dict(key["calibration"])
    return groups


def settings_of(job: Any) -> dict[str, Any]:
    """The settings a checkpoint must match to be resumed (stored as ``spp_settings``): the adapter, the model (name,
    path, content identity), everything that decides the pruned weights (:func:`pruning_settings`), the data and
    the optimisation (:data:`RESUME_DATA_KEYS`, :data:`RESUME_TRAINER_KEYS`)."""
    pruning = pruning_settings(job)
    return {"adapter": _plain(job.adapter),
            "model": {"name": job.model.name, "path": job.model.path, **pruning.pop("model")},
            "pruner": {"name": job.pruner.name, **pruning.pop("pruner", {})}, "sparsity": _plain(job.sparsity),
            **pruning, "data": _plain(job.data, RESUME_DATA_KEYS), "trainer": _plain(job.trainer, RESUME_TRAINER_KEYS)}


def compare_settings(saved: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(differences, not saved)``: ``key=value (checkpoint: value)`` for every key the checkpoint holds with
    another value (or that the job no longer has), and the keys the checkpoint predates (``group.*`` for a group)."""
    diffs: list[str] = []
    unsaved: list[str] = []
    for group, values in now.items():
        old = saved.get(group)
        if not isinstance(old, dict):
            unsaved.append(f"{group}.*")
            continue
        unsaved += [f"{group}.{k}" for k in values if k not in old]
        diffs += [f"{group}.{k}={values.get(k)!r} (checkpoint: {v!r})" for k, v in old.items() if values.get(k) != v]
    return diffs, unsaved


def check_resume(job: Any, checkpoint: str | os.PathLike[str]) -> None:
    """Compare a resume checkpoint's ``spp_settings`` with the job; name every key that differs. Settings the
    checkpoint predates (written by an older version) are not compared: a warning names them."""
    state_file = check_resume_format(job.strategy, checkpoint)  # a DeepSpeed directory: the file of its client state
    with user_file(checkpoint, "trainer.resume_from"):
        ckpt = torch.load(state_file, map_location="cpu", weights_only=False, mmap=True)
    saved = ckpt.get("spp_settings") if isinstance(ckpt, dict) else None
    if not saved:
        log.warning("preflight: %s holds no spp_settings (written before they were saved); not compared", checkpoint)
        return
    diffs, unsaved = compare_settings(saved, settings_of(job))
    if diffs:
        raise UserError(f"trainer.resume_from={str(checkpoint)!r} was written with other settings: {', '.join(diffs)}",
                        "resume with the checkpoint's settings, or start a new run without trainer.resume_from",
                        key="trainer.resume_from")
    if unsaved:
        log.warning("preflight: %s was written before these settings were saved, so they are not compared: %s",
                    checkpoint, ", ".join(unsaved))


# --------------------------------------------------------------------------------------------------------- stale


STALE_DIRS = (".merged.", ".adapter.", ".model.")
"""Prefixes of the temporary folders :func:`spp.atomic.write_dir_atomic` makes for the run's exports."""


def remove_stale_temporaries(run_dir: str | os.PathLike[str] | None, cache_dirs: list[str | os.PathLike[str]] = (),
                             min_age_s: float = 600.0) -> list[str]:
    """Remove what killed runs left: export folders ``.merged.*`` / ``.adapter.*`` / ``.model.*`` and ``.*.tmp``
    files in ``run_dir``; ``*.tmp`` files in the caches untouched for ``min_age_s`` (a live writer keeps its file
    fresh). Logs one line per removal; returns the removed paths."""
    removed: list[str] = []
    now = time.time()
    if run_dir is not None and Path(run_dir).is_dir():
        for path in Path(run_dir).iterdir():
            if path.is_dir() and path.name.startswith(STALE_DIRS):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
            elif path.is_file() and path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                removed.append(str(path))
    for cache in cache_dirs:
        root = Path(cache).expanduser()
        if not root.is_dir():
            continue
        for path in root.rglob("*.tmp"):
            try:
                if path.is_file() and now - path.stat().st_mtime > min_age_s:
                    path.unlink()
                    removed.append(str(path))
            except OSError:
                continue
    for path in removed:
        log.warning("removed a temporary left by a killed run: %s", path)
    return removed


# ------------------------------------------------------------------------------------------------------- commands


CACHE_DIR_FIX = "point cache_dir= (or the SPP_CACHE_DIR environment variable) at a directory you can write to"


def preflight_train(job: Any, resume: str | None = None) -> dict[str, Any]:
    """Everything ``train.py`` can check before loading a weight; returns the model's arch fields."""
    if get_method(job.adapter.name).trains:
        check_deepspeed(job.strategy, job.trainer.accelerator, get_method(job.adapter.name))
    check_pruner(job.pruner, job.sparsity)
    arch = model_arch(job.model)
    check_positive({"trainer.lr": job.trainer.lr})
    seqlens = {"data.max_length": job.data.max_length}
    if job.pruner.name != "none" and not job.sparsity.is_dense:
        seqlens["calibration.seqlen"] = job.calibration.seqlen
    if job.eval.ppl:
        seqlens["eval.seqlen"] = job.eval.seqlen
    check_shapes(arch, adapter=job.adapter, sparsity=job.sparsity, pruner=job.pruner, seqlens=seqlens)
    check_targets(arch, job.model.path, pruner=job.pruner, sparsity=job.sparsity, adapter=job.adapter)
    check_job(job, arch)  # the memory plan: every phase fits this machine's GPUs and host memory (docs/plan.md)
    if get_method(job.adapter.name).trains:
        check_data_source(job.data.source, job.data_dir)
    if job.pruner.name != "none" and not job.sparsity.is_dense and needs_calibration(job.pruner):
        check_calibration(job.calibration, job.data_dir)
    if job.eval.ppl:
        check_ppl_sources([job.eval.ppl_source, *job.eval.extra_ppl_sources], job.data_dir)
    if resume:
        check_resume(job, resume)
    caches = ["pruning"] if job.pruner.name != "none" and not job.sparsity.is_dense else []
    check_cache_dirs(job.cache_dir, caches + (["ppl"] if job.eval.ppl and (job.dense_ppl or job.pruned_ppl) else []))
    return arch


def preflight_prune(job: Any) -> dict[str, Any]:
    """Everything ``prune.py`` can check before loading a weight."""
    arch = model_arch(job.model)
    check_pruner(job.pruner, job.sparsity)
    calibrates = needs_calibration(job.pruner)
    seqlens = {"calibration.seqlen": job.calibration.seqlen} if calibrates else {}
    check_shapes(arch, sparsity=job.sparsity, pruner=job.pruner, seqlens=seqlens)
    check_targets(arch, job.model.path, pruner=job.pruner, sparsity=job.sparsity)
    if calibrates:
        check_calibration(job.calibration, job.data_dir)
    if job.use_cache and job.pruner.name != "none" and not job.sparsity.is_dense:
        check_cache_dirs(job.cache_dir, ["pruning"])
    return arch


def check_pruner(pruner: Any, sparsity: Any) -> None:
    """The pruner exists (a plug-in's only when ``SPP_PLUGINS`` names its folder) and accepts the pattern
    (:meth:`spp.pruning.base.Pruner.check`: SparseGPT's ``blocksize`` vs ``sparsity.m``)."""
    if pruner.name == "none" or sparsity.is_dense:
        return
    try:
        get_pruner(pruner).check(sparsity)
    except ValueError as err:
        raise UserError.from_message(str(err)) from err


def check_cache_dirs(cache_dir: str, subdirs: list[str]) -> None:
    """The caches the job will write (``<cache_dir>/pruning``, ``<cache_dir>/ppl``) are writable directories."""
    for sub in subdirs:
        check_writable_dir(Path(cache_dir).expanduser() / sub, "cache_dir", CACHE_DIR_FIX, value=cache_dir)


def check_calibration(calibration: Any, data_dir: str | None) -> None:
    """The calibration source's file exists (hub-free sources only)."""
    try:
        resolve_calibration_file(calibration, data_dir)
    except FileNotFoundError as err:
        raise UserError(f"calibration.source={calibration.source!r}: {str(err).split('; searched')[0]}",
                        "pass data_dir=<dir holding it> or calibration.path=<file>", key="calibration.source") from err


def check_ppl_sources(sources: list[str], data_dir: str | None) -> None:
    """The perplexity data files exist."""
    for source in sources:
        try:
            source_file(source, data_dir)
        except FileNotFoundError as err:
            raise UserError(f"eval.ppl_source={source!r}: {str(err).split('; searched')[0]}",
                            "pass data_dir=<dir holding it> or eval=none", key="eval.ppl_source") from err
