"""Generate from a model: ``python generate.py model.path=<run>/merged prompt="What is the capital of France?"``.

Composes ``conf/generate.yaml`` (typed by :class:`spp.generation.GenerateJobConfig`), loads the model the way
``train.py`` / ``eval.py`` do (:func:`spp.models.load_model`), wraps the prompt in the Alpaca template
(``template=none`` for raw text), decodes greedily (``do_sample=true temperature=… top_p=… seed=…`` to sample)
and prints the completion with tokens/s; ``generation.json`` goes to the run directory. ``sparse24=true`` runs
the 7 projections as PyTorch 2:4 semi-structured sparse tensors (CUDA sm80+, a model pruned 2:4); anything
else stops with one ``generate.py: error: ...`` line.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
import torch  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerBase  # noqa: E402

from spp.atomic import write_json_atomic  # noqa: E402
from spp.cli_help import register_help  # noqa: E402
from spp.errors import cli_errors, to_job  # noqa: E402
from spp.generation import (  # noqa: E402
    GenerateJobConfig,
    GenerationResult,
    format_prompt,
    generate_text,
    register_configs,
    to_sparse24,
)
from spp.models import load_model  # noqa: E402
from spp.models.config import DTYPES  # noqa: E402
from spp.overrides import checked_overrides  # noqa: E402
from spp.preflight.model_files import check_tokenizer_files  # noqa: E402

register_configs()
register_help()


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


def run(job: GenerateJobConfig, output_file: Path | None) -> GenerationResult:
    """Load, optionally convert to 2:4 semi-structured, generate, print and write the record.

    Raises:
        SystemExit: one ``generate.py: error: ...`` line for a bad config key, an unloadable model, or a
            ``sparse24=true`` that cannot run (no CUDA, a layer that is not 2:4).
    """
    try:
        format_prompt(job.prompt, job.template, job.input)
        dtype_name = job.dtype or job.model.torch_dtype
        if dtype_name not in DTYPES:
            raise ValueError(f"dtype={dtype_name!r} is not one of {list(DTYPES)}")
        if job.sparse24 and dtype_name == "float32":
            dtype_name = "bfloat16"  # the semi-structured kernels take fp16/bf16 only
        model, tokenizer = load_model(job.model, dtype=dtype_name, with_tokenizer=not job.tokenizer)
        if job.tokenizer:
            tokenizer = load_tokenizer_from(job.tokenizer)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"generate.py: error: {err}")
    device = job.device or ("cuda" if torch.cuda.is_available() else "cpu")
    converted: list[str] = []
    if job.sparse24:
        if job.device is not None and not job.device.startswith("cuda"):
            sys.exit(f"generate.py: error: sparse24=true runs on CUDA only; drop device={job.device} or sparse24=true")
        try:
            converted = to_sparse24(model, DTYPES[dtype_name], device)
        except (ValueError, RuntimeError) as err:
            sys.exit(f"generate.py: error: sparse24=true: {err}")
    else:
        model.to(device)
    kwargs = dict(max_new_tokens=job.max_new_tokens, template=job.template, input=job.input,
                  do_sample=job.do_sample, temperature=job.temperature, top_p=job.top_p, seed=job.seed)
    try:
        for _ in range(job.warmup):
            generate_text(model, tokenizer, job.prompt, **kwargs)
        result = generate_text(model, tokenizer, job.prompt, **kwargs)
    except ValueError as err:
        sys.exit(f"generate.py: error: {err}")
    result.sparse24 = bool(converted)
    how = "sampled" if job.do_sample else "greedy"
    kernels = f", 2:4 semi-structured ({len(converted)} layers)" if converted else ""
    print(f"### Prompt:\n{result.prompt}\n\n### Completion:\n{result.completion}\n")
    print(f"{result.new_tokens} new tokens in {result.seconds:.2f} s = {result.tokens_per_s:.1f} tokens/s "
          f"({how}, {result.device}, {result.dtype}{kernels})")
    if output_file is not None:
        write_json_atomic(output_file, {**result.to_dict(), "model": job.model.path,
                                        "config": OmegaConf.to_container(OmegaConf.structured(job))})
    return result


@checked_overrides("generate.py", GenerateJobConfig)
@hydra.main(version_base="1.3", config_path="conf", config_name="generate")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns tokens/s (so ``-m`` sweeps can compare settings)."""
    with cli_errors("generate.py"):
        job: GenerateJobConfig = to_job(cfg, GenerateJobConfig)
        check_tokenizer_files(job.model, job.tokenizer)  # before the weights load
    out = Path(job.output_file) if job.output_file else Path(HydraConfig.get().runtime.output_dir) / "generation.json"
    return run(job, out).tokens_per_s


if __name__ == "__main__":
    main()
