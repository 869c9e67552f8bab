"""The model's files, checked before any weight is loaded: the GGUF header, the safetensors headers and
``config.json``; :func:`model_arch` reads the architecture fields from them."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

from gguf import GGUF_MAGIC, READER_SUPPORTED_VERSIONS, GGUFValueType, Keys
from safetensors import SafetensorError, safe_open

from spp.errors import UserError, user_file
from spp.models.config import ModelConfig
from spp.models.loading import resolve_source
from spp.models.tiny import TINY_ARCH, tiny_config

_GGUF_SCALARS = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
                 GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
                 GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
                 GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
GGUF_ARCH_KEYS = {
    Keys.LLM.EMBEDDING_LENGTH: "hidden_size",
    Keys.LLM.FEED_FORWARD_LENGTH: "intermediate_size",
    Keys.LLM.BLOCK_COUNT: "num_hidden_layers",
    Keys.Attention.HEAD_COUNT: "num_attention_heads",
    Keys.Attention.HEAD_COUNT_KV: "num_key_value_heads",
    Keys.LLM.CONTEXT_LENGTH: "max_position_embeddings",
    Keys.Attention.KEY_LENGTH: "head_dim",
    Keys.LLM.VOCAB_SIZE: "vocab_size",
}
"""GGUF metadata keys (``{arch}`` = ``general.architecture``) → ``config.json``'s standard names (a family that
names them otherwise, GPT-2's ``n_positions``, takes them through its config's ``attribute_map``:
:func:`spp.planning.shapes.arch_config`)."""


def _fix_model_path(cfg: ModelConfig) -> str:
    return f"point model.path= at a complete model (a directory with config.json and weights, or a .gguf file); " \
           f"now {cfg.path!r}"


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise EOFError("file ends inside the GGUF header")
    return struct.unpack(fmt, data)[0]


def _gguf_value(fh: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _GGUF_SCALARS:
        return _read(fh, _GGUF_SCALARS[GGUFValueType(kind)])
    if kind == GGUFValueType.STRING:
        n = _read(fh, "<Q")
        data = fh.read(n)
        if len(data) != n:
            raise EOFError("file ends inside a GGUF string")
        return data.decode("utf-8", errors="replace") if keep else None
    if kind == GGUFValueType.ARRAY:
        item, count = _read(fh, "<I"), _read(fh, "<Q")
        if item in _GGUF_SCALARS:
            fh.seek(count * struct.calcsize(_GGUF_SCALARS[GGUFValueType(item)]), os.SEEK_CUR)
            return None
        for _ in range(count):
            _gguf_value(fh, item, keep=False)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The scalar key/value metadata of a GGUF file's header (arrays such as the vocabulary are skipped).

    Read value by value with ``gguf``'s type codes: ``gguf.GGUFReader`` parses every vocabulary string (8 s for
    SmolLM2's header against 0.1 s here). Raises ``ValueError`` (bad magic or version), ``EOFError`` /
    ``struct.error`` (cut short).
    """
    with Path(path).open("rb") as fh:
        if fh.read(4) != struct.pack("<I", GGUF_MAGIC):
            raise ValueError("not a GGUF file (the first 4 bytes are not 'GGUF')")
        version = _read(fh, "<I")
        if version not in READER_SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
        _read(fh, "<Q")  # tensor count
        meta: dict[str, Any] = {}
        for _ in range(_read(fh, "<Q")):
            key = _gguf_value(fh, GGUFValueType.STRING, keep=True)
            meta[key] = _gguf_value(fh, _read(fh, "<I"), keep=True)
    return meta


def _gguf_arch(cfg: ModelConfig, path: Path) -> dict[str, Any]:
    with user_file(path, "model.path", _fix_model_path(cfg)):
        meta = gguf_metadata(path)
    kind = meta.get(Keys.General.ARCHITECTURE, "llama")
    arch = {name: meta[key.format(arch=kind)] for key, name in GGUF_ARCH_KEYS.items() if key.format(arch=kind) in meta}
    return {**dict(cfg.arch), **arch, "model_type": kind}


def model_arch(cfg: ModelConfig) -> dict[str, Any]:
    """The architecture fields of ``cfg`` (config.json names) without loading a weight; checks the weight files.

    ``tiny``: its built-in arch plus ``model.arch``; a directory: ``config.json`` (and the safetensors headers); a
    GGUF file: its header; a hub id: ``model.arch`` (may be empty: the shape checks are then skipped).

    Raises:
        UserError: a missing path, a damaged ``config.json``, GGUF header or safetensors file (naming the file).
    """
    try:
        kind, where, gguf_file = resolve_source(cfg)
    except FileNotFoundError as err:
        raise UserError(str(err).split(";")[0], _fix_model_path(cfg), key="model.path") from err
    if kind == "tiny":  # LLaMA's fields, or the whole config of another tiny family (spp.models.tiny)
        if cfg.arch.get("model_type", "llama") != "llama":
            return tiny_config(**cfg.arch).to_dict()
        return {**TINY_ARCH, **dict(cfg.arch)}
    if kind == "hub":
        return dict(cfg.arch)
    if gguf_file:
        return _gguf_arch(cfg, Path(where) / gguf_file)
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
            try:  # safe_open checks the file is as long as its header says
                with safe_open(str(file), framework="pt"):
                    pass
            except SafetensorError as err:
                raise EOFError(f"truncated or damaged safetensors file ({file.stat().st_size} bytes): {err}") from err
    return arch
