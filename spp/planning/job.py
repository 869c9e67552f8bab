"""A training job's run plan from its typed config and its model's arch fields, and the one-line refusal of what
cannot fit, before any weight is read. The job is read duck-typed so that ``spp.planning`` imports no
``spp.training``; what a plan cannot know without reading data comes from the constants below, each with its source.
"""

from __future__ import annotations

import logging
import math
from contextlib import suppress
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import Any

import psutil
import torch

from spp.errors import UserError
from spp.models.loading import resolve_source
from spp.planning.adapter import adapter_spec
from spp.planning.check import check
from spp.planning.hardware import GIB, Hardware, for_accelerator
from spp.planning.pruning import Calibration
from spp.planning.reconstruction import reconstruct_spec
from spp.planning.report import as_json, text
from spp.planning.run import RunPlan, plan_run
from spp.planning.shapes import arch_config, dtype_bytes, shape_from_arch
from spp.planning.spec import EvalSpec, RunSpec, TrainSpec
from spp.projections import DEFAULT_TARGETS
from spp.pruning.resolve import resolve_adapter, resolve_form, resolve_pruner

RECORDS = {"alpaca/cleaned_partial/alpaca_data_cleaned_0.json": 1551, "alpaca/cleaned_partial": 50921,
           "hub:yahma/alpaca-cleaned": 51760}
"""Valid Alpaca records of the known sources (``conf/data/*.yaml``; the hub copy's card: 51,760)."""

DEFAULT_RECORDS = 50921
"""Records assumed for another source without ``data.max_examples``."""

EXAMPLE_TOKENS, PADDED_TOKENS = 106, 192
"""Mean tokens of an Alpaca example (template, response and EOS) and mean padded length of a shuffled batch of 8,
with SmolLM2's tokenizer on the shipped 1551-record sample (cut at 512); a byte-level tokenizer gives
1 / :data:`BPE_TOKENS_PER_CHAR` times more."""

TEXT_CHARS = {"wikitext2": 1_294_336, "c4": 2_190_456}
"""Characters of the perplexity texts as ``spp.eval.perplexity.load_eval_text`` joins them (WikiText-2 test;
the first 1,100 documents of the C4 sample); another source is counted as WikiText-2."""

BPE_TOKENS_PER_CHAR = 0.236
"""SmolLM2's tokenizer: 304,986 tokens for WikiText-2 test's 1,294,336 characters (LLaMA's gives about as many)."""

TASK_TOKENS: dict[str, tuple[int, int]] = {
    "boolq": (3270, 150), "rte": (277, 80), "hellaswag": (10042, 440), "winogrande": (1267, 60),
    "arc_easy": (2376, 160), "arc_challenge": (1172, 180), "openbookqa": (500, 120), "mmlu": (14042, 620)}
"""``(documents, tokens per document)`` lm-eval feeds the model per task: the full split's size, times the
requests per document (continuations of one token share one forward: BoolQ, RTE, MMLU; HellaSwag and ARC run
one per choice) and an assumed request length (MMLU: a 5-shot prompt). The paper's protocol (``eval=paper``)
sums to 14.4 M tokens."""

log = logging.getLogger(__name__)

ZERO_SHOT = ("boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
MMLU_SUBJECT_COUNT = 57


def lm_eval_tokens(tasks: list[str], limit: int | None, mmlu_limit: int | None) -> int:
    """Tokens of ``eval.tasks`` (:data:`TASK_TOKENS`; ``limit`` documents per task, ``mmlu_limit`` per MMLU
    subject; a subject or category task is counted as one subject)."""
    total = 0
    names = [task.removeprefix("spp_") for task in tasks]
    for leaf in chain.from_iterable(ZERO_SHOT if name in ("zeroshot", "zero_shot") else [name] for name in names):
        if leaf == "mmlu" or leaf.startswith("mmlu_"):
            subjects = MMLU_SUBJECT_COUNT if leaf == "mmlu" else 1
            per_subject = TASK_TOKENS["mmlu"][0] // MMLU_SUBJECT_COUNT
            cap = mmlu_limit or limit
            total += subjects * min(per_subject, cap or per_subject) * TASK_TOKENS["mmlu"][1]
        else:
            docs, per_doc = TASK_TOKENS.get(leaf, (1000, 200))
            total += min(docs, limit or docs) * per_doc
    return total


def precision_bytes(precision: str, kind: str) -> int:
    """Bytes per activation value: ``auto`` is bf16-mixed on a GPU and 32-true on a CPU (``spp.training``)."""
    if precision == "auto":
        return 2 if kind == "gpu" else 4
    return 8 if precision.startswith("64") else 2 if "16" in precision else 4


def device_count(devices: Any, kind: str) -> int:
    """``trainer.devices`` as a count (a list: its length; ``auto``/-1: the visible GPUs, else 1)."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if str(devices) in ("auto", "-1"):
        return max(1, torch.cuda.device_count()) if kind == "gpu" else 1
    return int(devices)


def strategy_name(job: Any, world: int) -> str:
    """``job.strategy.name`` with ``auto`` resolved for ``world`` processes: ``ddp`` over several, else ``single``."""
    name = str(job.strategy.name)  # a StrategyName prints as its value
    return name if name != "auto" else ("ddp" if world > 1 else "single")


def _train_spec(job: Any, world: int, bpe: float) -> TrainSpec:
    """What :class:`TrainSpec` needs of ``data.*`` and ``trainer.*`` (records from :data:`RECORDS`)."""
    data, trainer = job.data, job.trainer
    records = data.max_examples or RECORDS.get(str(data.source), DEFAULT_RECORDS)
    val = min(data.val_size, math.floor(data.max_val_fraction * records)) if data.val_size else 0
    scale = BPE_TOKENS_PER_CHAR / bpe  # a byte-level tokenizer makes an example this many times longer
    per_example = min(data.max_length, round(PADDED_TOKENS * scale))
    global_batch = trainer.global_batch_size or data.train_batch_size * world * trainer.accumulate_grad_batches
    examples = records - val
    steps = max(1, -(-examples * trainer.max_epochs // global_batch))
    if trainer.max_steps > 0:
        steps = min(steps, trainer.max_steps)
    every = trainer.checkpoint_every_n_steps
    saved = steps // every if every else trainer.max_epochs
    kept = (saved if trainer.save_top_k < 0 else min(trainer.save_top_k, saved)) + 1
    checkpointing = bool(trainer.gradient_checkpointing or job.strategy.activation_checkpointing)
    return TrainSpec(micro_batch=data.train_batch_size, seqlen=data.max_length, tokens_per_example=per_example,
                     checkpointing=checkpointing, examples=examples, epochs=trainer.max_epochs,
                     max_steps=trainer.max_steps, global_batch=global_batch, checkpoints_kept=kept)


def _eval_spec(job: Any, prunes: bool, per_char: float) -> EvalSpec:
    """What :class:`EvalSpec` needs of ``eval.*``, ``dense_ppl`` and ``pruned_ppl``."""
    ev = job.eval
    sources = [ev.ppl_source, *ev.extra_ppl_sources] if ev.ppl else []  # each measured with the same settings
    tokens = [int(TEXT_CHARS.get(str(s).removeprefix("hf:"), TEXT_CHARS["wikitext2"]) * per_char) for s in sources]
    windows = [ev.max_windows or t // ev.seqlen for t in tokens]
    before = (int(job.dense_ppl) + int(job.pruned_ppl and prunes)) if ev.ppl else 0
    return EvalSpec(ppl_windows=sum(windows[:1]), seqlen=ev.seqlen, batch=ev.batch_size, before=before,
                    text_tokens=sum(tokens[:1]), extra_ppl_windows=sum(windows[1:]),
                    extra_text_tokens=max(tokens[1:], default=0),
                    lm_eval_tokens=lm_eval_tokens(list(ev.tasks), ev.limit, ev.mmlu_limit),
                    lm_eval_batch=ev.lm_eval_batch_size)


def job_spec(job: Any, arch: dict[str, Any], kind: str, source: str, devices: int | None = None,
             nodes: int | None = None, methods: Any = None) -> RunSpec:
    """The :class:`RunSpec` of ``job`` on ``kind``; ``devices`` and ``nodes`` replace ``trainer.devices`` /
    ``trainer.num_nodes`` (the Slurm launcher's request)."""
    nbytes = dtype_bytes(job.model.torch_dtype)
    shape = shape_from_arch(job.model.name, arch, list(job.pruner.targets) or list(DEFAULT_TARGETS), nbytes)
    devices = devices or device_count(job.trainer.devices, kind)
    nodes = nodes or int(job.trainer.num_nodes)
    if methods is not None:  # the job's resolved spp.training.run.Methods, read duck-typed
        pruner, method, form = methods.pruner, methods.adapter, methods.form
    else:  # the resolver's (spp.pruning.resolve)
        cfg = getattr(job, "reconstruct", None)
        form = resolve_form(cfg) if cfg is not None else None
        pruner, method = resolve_pruner(job.pruner, job.sparsity), resolve_adapter(job.adapter.name)
    prunes = pruner is not None  # a pruner and a pattern that is not dense
    per_char = 1.0 if shape.vocab <= 512 else BPE_TOKENS_PER_CHAR  # a byte-level vocabulary: a token per character
    cal = job.calibration
    return RunSpec(shape=shape, kind=kind, devices=devices, nodes=nodes, strategy=strategy_name(job, devices * nodes),
                   zero_stage=int(job.strategy.stage),
                   act_bytes=precision_bytes(str(job.trainer.precision), kind), source=source,
                   adapter=adapter_spec(job.adapter, arch, shape, str(job.model.torch_dtype), method),
                   train=_train_spec(job, devices * nodes, per_char),
                   eval=_eval_spec(job, prunes, per_char), pruner=job.pruner.name, prunes=prunes,
                   updates_weights=prunes and bool(pruner.updates_weights),
                   uses_hessian=prunes and bool(pruner.uses_hessian),
                   calibration=Calibration(cal.nsamples, cal.seqlen, cal.batch_size),
                   true_sequential=bool(job.pruner.true_sequential), export_merged=bool(job.export.merged),
                   export_adapter=bool(job.export.adapter), reconstruct=reconstruct_spec(job, arch, form),
                   # what the objective needs of the dense teacher, read duck-typed (spp.training.objectives)
                   teacher=str(getattr(getattr(job, "objective", None), "teacher_outputs", "none")))


def job_hardware(job: Any, kind: str, detect: bool) -> Hardware:
    """The preset of ``kind`` with ``trainer.device_memory_gib`` / ``host_memory_gib`` when set; else with
    ``detect`` (a real run) this machine's (no CUDA: GPU not checked); else the preset's GPU and no host figure."""
    hw = for_accelerator(kind)
    device, host = job.trainer.device_memory_gib, job.trainer.host_memory_gib
    if device is None and detect and kind == "gpu":  # this machine's first GPU (none without CUDA)
        cuda = torch.cuda.get_device_properties(0).total_memory / GIB if torch.cuda.is_available() else None
        hw = replace(hw, device_gib=cuda)
    elif device is not None:
        hw = replace(hw, device_gib=float(device))
    if host is None and detect:
        host = host_memory_gib()
    return replace(hw, host_gib=None if host is None else float(host))


def host_memory_gib() -> float:
    """Memory this process may use: the machine's (psutil), or a smaller cgroup limit (a Slurm job's ``--mem``)."""
    total = psutil.virtual_memory().total
    with suppress(OSError):  # no cgroup v2 limit to read
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        total = min(total, int(limit)) if limit.isdigit() else total
    return total / GIB


def plan_job(job: Any, arch: dict[str, Any], kind: str, source: str, hw: Hardware | None = None,
             devices: int | None = None, nodes: int | None = None, methods: Any = None) -> RunPlan:
    """The run plan of ``job`` (see :func:`job_spec`) on ``hw`` (default: the preset of ``kind``)."""
    spec = job_spec(job, arch, kind, source, devices, nodes, methods)
    return plan_run(spec, hw or for_accelerator(kind))


SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
"""Arch fields a plan needs (a hub id without ``model.arch`` has none: no plan, no check)."""


def missing_shape(arch: dict[str, Any]) -> list[str]:
    """The :data:`SHAPE_KEYS` that ``arch`` does not give, named as ``transformers``' config of its family names them
    (``attribute_map``: GPT-2's ``n_layer`` is ``num_hidden_layers``); a field the family's config lacks (GPT-2's
    and OPT's MLP width, ``n_inner`` / ``ffn_dim``) is not asked for."""
    try:
        config = arch_config(arch) if arch else None
    except (ValueError, KeyError, TypeError):  # a config transformers cannot make: the fields as written
        config = None
    given = set(arch) | {std for std, own in getattr(config, "attribute_map", {}).items() if own in arch}
    return [k for k in SHAPE_KEYS if k not in given and (config is None or hasattr(config, k))]


def accelerator_kind(accelerator: str, plan_only: bool) -> str:
    """``gpu`` or ``cpu``. ``auto`` is what Lightning picks here (a GPU when CUDA is available); for ``plan=true``
    it is a GPU: a plan is made for the machine the job will run on, usually not the one planning it."""
    if accelerator == "cpu":
        return "cpu"
    if accelerator in ("gpu", "cuda") or plan_only:
        return "gpu"
    return "gpu" if torch.cuda.is_available() else "cpu"


def model_source(job: Any) -> str:
    """Where the weights come from: ``tiny``, ``gguf``, ``dir`` or ``hub`` (no file is read)."""
    try:
        return resolve_source(job.model)[0]
    except FileNotFoundError:
        return "dir"


def _sources(job: Any) -> dict[str, str]:
    gpu = f"trainer.device_memory_gib={job.trainer.device_memory_gib:g}" if job.trainer.device_memory_gib else \
        "this machine's GPU"
    host = f"trainer.host_memory_gib={job.trainer.host_memory_gib:g}" if job.trainer.host_memory_gib else \
        "this machine's memory"
    return {"GPU": gpu, "host": host}


def check_job(job: Any, arch: dict[str, Any], methods: Any = None) -> RunPlan | None:
    """Plan the job on this machine and raise the one-line :class:`~spp.errors.UserError` of the first phase that
    does not fit; ``None`` when the arch is unknown (a hub id without ``model.arch``)."""
    if missing_shape(arch):
        return None
    kind = accelerator_kind(str(job.trainer.accelerator), plan_only=False)
    try:
        plan = plan_job(job, arch, kind, model_source(job), job_hardware(job, kind, detect=True), methods=methods)
    except UserError:  # a setting the plan cannot use (reconstruct.form): the user's to fix, not a model's
        raise
    except (ValueError, KeyError, TypeError) as err:  # an architecture transformers cannot build on meta
        log.warning("preflight: no memory plan for model %s (%s: %s); not checked", job.model.name,
                    type(err).__name__, err)
        return None
    check(plan, _sources(job))
    return plan


ASSUMED_NODE_HOST_GIB = 2048.0
"""Host memory of a GPU node that ``plan=true`` assumes without ``trainer.host_memory_gib``: a DGX H100's 2 TB."""


def plan_hardware(job: Any, kind: str) -> tuple[Hardware, dict[str, str]]:
    """``plan=true``'s machine and where its figures come from: GPU memory ``trainer.device_memory_gib`` or 80 GiB;
    host memory per node ``trainer.host_memory_gib``, else :data:`ASSUMED_NODE_HOST_GIB` for a GPU node, else
    (a CPU run) this machine's."""
    hw, sources = job_hardware(job, kind, detect=False), _sources(job)
    if not job.trainer.device_memory_gib:
        sources["GPU"] = "assumed; trainer.device_memory_gib states it"
    if hw.host_gib is None and kind == "gpu":
        hw = replace(hw, host_gib=ASSUMED_NODE_HOST_GIB)
        sources["host"] = "assumed: a DGX H100 node's; trainer.host_memory_gib states it"
    elif hw.host_gib is None:
        hw = replace(hw, host_gib=host_memory_gib())
    return hw, sources


def plan_output(job: Any, arch: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``plan=true``: the plan's text and JSON, on :func:`plan_hardware`'s machine."""
    missing = missing_shape(arch)
    if missing:
        raise UserError(f"plan=true needs the model's shape, but model.path={job.model.path!r} gives no "
                        f"{', '.join(missing)} without loading it", "add the fields under model.arch (see "
                        "conf/model/llama7b.yaml) or point model.path at a local directory", key="model.arch")
    kind = accelerator_kind(str(job.trainer.accelerator), plan_only=True)
    hw, sources = plan_hardware(job, kind)
    plan = plan_job(job, arch, kind, model_source(job), hw)
    return text(plan, sources), as_json(plan)
