"""``generate.py``: load a model, generate one completion, print it with tokens/s and record it in
``<run_dir>/generation.json``; the tokenizer files are checked before the weights load."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from spp.atomic import write_json_atomic
from spp.commands.entry import Command, hydra_output_dir
from spp.errors import UserError, user_errors
from spp.generation import (
    GenerateJobConfig,
    GenerationResult,
    format_prompt,
    generate_text,
    register_generate_schema,
    to_sparse24,
)
from spp.models import load_model
from spp.models.config import DTYPES
from spp.models.loading import check_tokenizer_files


def run(job: GenerateJobConfig) -> float:
    """Generate once; returns tokens/s (so ``-m`` sweeps can compare settings)."""
    check_tokenizer_files(job.model, job.tokenizer)  # before the weights load
    out = Path(job.run_dir or hydra_output_dir()).expanduser() / "generation.json"
    return generate_one(job, out).tokens_per_s


def load_tokenizer_from(source: str) -> PreTrainedTokenizerBase:
    """The tokenizer of ``tokenizer=<folder or hub id>`` (pad token set to EOS when it has none)."""
    try:
        tok = AutoTokenizer.from_pretrained(str(Path(source).expanduser()) if Path(source).expanduser().is_dir()
                                            else source)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"could not load the tokenizer of tokenizer={source!r}: {err}") from err
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def generate_one(job: GenerateJobConfig, output_file: Path) -> GenerationResult:
    """Load, optionally convert to 2:4 semi-structured, generate, print and write the record."""
    model, tokenizer, dtype_name = _load(job)
    device = job.device or ("cuda" if torch.cuda.is_available() else "cpu")
    converted = _to_device(job, model, dtype_name, device)
    kwargs = dict(max_new_tokens=job.max_new_tokens, template=job.template, input=job.input,
                  do_sample=job.do_sample, temperature=job.temperature, top_p=job.top_p, seed=job.seed)
    with user_errors(ValueError):
        for _ in range(job.warmup):
            generate_text(model, tokenizer, job.prompt, **kwargs)
        result = generate_text(model, tokenizer, job.prompt, **kwargs)
    result.sparse24 = bool(converted)
    how = "sampled" if job.do_sample else "greedy"
    kernels = f", 2:4 semi-structured ({len(converted)} layers)" if converted else ""
    print(f"### Prompt:\n{result.prompt}\n\n### Completion:\n{result.completion}\n")
    print(f"{result.new_tokens} new tokens in {result.seconds:.2f} s = {result.tokens_per_s:.1f} tokens/s "
          f"({how}, {result.device}, {result.dtype}{kernels})")
    write_json_atomic(output_file, {**result.to_dict(), "model": job.model.path,
                                    "config": OmegaConf.to_container(OmegaConf.structured(job))})
    return result


def _load(job: GenerateJobConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The model (on the CPU), its tokenizer (``tokenizer=`` when given) and the dtype's name; a bad prompt
    template, dtype, model or tokenizer raises a :class:`UserError`."""
    with user_errors(ValueError, FileNotFoundError):
        format_prompt(job.prompt, job.template, job.input)
        dtype_name = job.dtype or job.model.torch_dtype
        if dtype_name not in DTYPES:
            raise ValueError(f"dtype={dtype_name!r} is not one of {list(DTYPES)}")
        if job.sparse24 and dtype_name == "float32":
            dtype_name = "bfloat16"  # the semi-structured kernels take fp16/bf16 only
        model, tokenizer = load_model(job.model, dtype=dtype_name, with_tokenizer=not job.tokenizer)
        if job.tokenizer:
            tokenizer = load_tokenizer_from(job.tokenizer)
    return model, tokenizer, dtype_name


def _to_device(job: GenerateJobConfig, model: PreTrainedModel, dtype_name: str, device: str) -> list[str]:
    """Move the model to ``device``; with ``sparse24=true``, convert its projections to 2:4 semi-structured
    tensors there instead (CUDA only) and return the names of the converted layers."""
    if not job.sparse24:
        model.to(device)
        return []
    if job.device is not None and not job.device.startswith("cuda"):
        raise UserError(f"sparse24=true runs on CUDA only, device={job.device}", "drop device= or sparse24=true",
                        key="sparse24")
    with user_errors(ValueError, RuntimeError, prefix="sparse24=true: "):
        return to_sparse24(model, DTYPES[dtype_name], device)


COMMAND = Command("generate.py", "generate", GenerateJobConfig, run, register_generate_schema)
"""``python generate.py ...``: composes ``conf/generate.yaml`` into :class:`GenerateJobConfig`, runs :func:`run`."""
