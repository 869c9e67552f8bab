"""Text generation from a (merged, pruned) causal LM: Alpaca prompt, greedy or sampled decoding, tokens/s, 2:4 path.

SPP's merge ``W ⊙ (1 + s·Repeat(α)⊙β)`` (paper Eq. 4-6) keeps every pruned zero, so a 2:4 model stays 2:4."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from spp.data.prompts import RESPONSE_SPLIT, user_prompt
from spp.export.semi_structured import export_semi_structured
from spp.job_base import JobConfig
from spp.models.config import ModelConfig

TEMPLATES: tuple[str, ...] = ("alpaca", "none")
"""``template`` values: ``alpaca`` wraps the prompt as an Alpaca instruction (how SPP runs are tuned),
``none`` feeds it verbatim (plain continuation, e.g. for the dense base model)."""

FIXED_PROMPT: str = "What is the capital of France?"
"""The prompt the training job's end-of-run completion uses for the dense, pruned and merged models."""


@dataclass
class GenerationResult:
    """One completion (new tokens only, stripped) and the wall time of ``model.generate``; ``new_tokens`` counts EOS."""

    prompt: str
    text: str
    completion: str
    new_tokens: int
    seconds: float
    tokens_per_s: float
    device: str
    dtype: str
    sampled: bool
    sparse24: bool = False
    token_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (what ``generate.py`` writes to ``generation.json``)."""
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """The record a run's summary keeps: :meth:`to_dict` without the prompt, the full text and the token ids."""
        return {k: v for k, v in self.to_dict().items() if k not in ("token_ids", "text", "prompt")}


def format_prompt(prompt: str, template: str = "alpaca", input: str = "") -> str:
    """Apply the prompt ``template``: ``alpaca`` (the training template up to ``### Response:\\n``) or ``none``."""
    if template == "alpaca":
        return user_prompt(prompt, input)
    if template == "none":
        return prompt if not input else f"{prompt}\n{input}"
    raise ValueError(f"template={template!r} is not one of {list(TEMPLATES)}; set template=alpaca or template=none")


def generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    template: str = "alpaca",
    input: str = "",
    do_sample: bool = False,
    temperature: float = 0.7,
    top_p: float = 0.9,
    seed: int = 0,
) -> GenerationResult:
    """One completion for ``prompt`` on the model's device and dtype; greedy, or nucleus sampling under ``seed``
    (global RNG restored). The model's ``generation_config`` sampling defaults are ignored; BOS as in training.
    The settings come checked: :class:`GenerateJobConfig` and ``train.py``'s ``sample.*`` refuse bad ones."""
    text = format_prompt(prompt, template, input)
    device = next(model.parameters()).device
    enc = tokenizer(text, return_tensors="pt").to(device)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": 0} if do_sample else {}
    gen_config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=do_sample, eos_token_id=eos,
                                  pad_token_id=pad, **sampling)
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []), torch.inference_mode():
        torch.manual_seed(seed)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = model.generate(**enc, generation_config=gen_config)
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
    new_ids = out[0, enc["input_ids"].shape[1]:].tolist()
    completion = tokenizer.decode(new_ids, skip_special_tokens=True)
    if template == "alpaca" and RESPONSE_SPLIT in completion:  # a model that starts a new turn: keep the answer
        completion = completion.split(RESPONSE_SPLIT, 1)[0]
    return GenerationResult(
        prompt=prompt, text=text, completion=completion.strip(), new_tokens=len(new_ids), seconds=seconds,
        tokens_per_s=len(new_ids) / seconds if seconds > 0 else float("inf"), device=str(device),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."), sampled=do_sample, token_ids=new_ids,
    )


def to_sparse24(model: PreTrainedModel, dtype: torch.dtype = torch.bfloat16, device: str = "cuda") -> list[str]:
    """Move ``model`` to CUDA in ``dtype`` with every 2:4 target projection semi-structured sparse; returns their
    names. The 2:4 pattern and shape limits are checked on every layer first."""
    if torch.cuda.is_available():
        model.to(device, dtype)
    return export_semi_structured(model)


@dataclass
class GenerateJobConfig(JobConfig):
    """``generate.py`` (``conf/generate.yaml``): load a model, generate one completion, print it with tokens/s
    (of the shared keys it reads only ``seed``: the sampling seed).

    Attributes:
        model: The model to load; a trained run's export is ``model.path=<run_dir>/merged``.
        prompt: The instruction (``template=alpaca``) or raw text (``template=none``).
        input: Optional Alpaca ``### Input:`` context.
        template: ``alpaca`` (default: how SPP runs are instruction-tuned) or ``none``.
        max_new_tokens: Tokens to generate at most (stops earlier on EOS).
        do_sample: ``false`` = greedy (deterministic); ``true`` = nucleus sampling.
        temperature: Sampling temperature (``do_sample=true`` only).
        top_p: Nucleus mass (``do_sample=true`` only).
        device: ``cpu``, ``cuda``, ``cuda:1``; null = CUDA when available, else CPU.
        dtype: Override ``model.torch_dtype`` (``float32``, ``bfloat16``, ``float16``); null = keep it.
        sparse24: Run the 7 projections as PyTorch 2:4 semi-structured sparse tensors (CUDA sm80+, a model
            pruned ``sparsity=nm2_4``; runs in ``dtype`` or bfloat16).
        warmup: Untimed generations before the timed one (kernel selection, caches); 0 on CPU is fine.
        tokenizer: Folder (or hub id) to load the tokenizer from; null = ``model.path``. For a merged model
            copied without its tokenizer files, point it at the base model's folder.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    prompt: str = FIXED_PROMPT
    input: str = ""
    template: str = "alpaca"
    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 0.7
    top_p: float = 0.9
    device: str | None = None
    dtype: str | None = None
    sparse24: bool = False
    warmup: int = 0
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        """Value ranges, checked when the config is built (before any weight is read)."""
        super().__post_init__()
        checks = [
            (self.max_new_tokens >= 1, f"max_new_tokens={self.max_new_tokens} must be >= 1"),
            (self.warmup >= 0, f"warmup={self.warmup} must be >= 0"),
            (not self.do_sample or 0 < self.temperature < float("inf"),
             f"temperature={self.temperature} must be a finite number > 0 with do_sample=true"),
            (not self.do_sample or 0 < self.top_p <= 1, f"top_p={self.top_p} must be in (0, 1] with do_sample=true"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        problem = device_problem(self.device)
        if problem:
            raise ValueError(problem)


def device_problem(device: str | None) -> str | None:
    """Why ``device`` cannot run here (not a device name, or a CUDA device this machine does not have), else None."""
    try:
        where = torch.device(device) if device is not None else None
    except RuntimeError:
        return f"device={device!r} is not a device; use cpu, cuda or cuda:<index> (or leave it unset)"
    if where is not None and where.type == "cuda" and (where.index or 0) >= torch.cuda.device_count():
        return (f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s); use device=cpu "
                "or leave device unset (CUDA when available)")
    return None


def register_generate_schema() -> None:
    """Store :class:`GenerateJobConfig` as ``generate_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="generate_schema", node=GenerateJobConfig)
