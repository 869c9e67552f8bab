"""Every paper-table sweep in ``experiments/*/run.sh`` composes (never runs), for a LLaMA size and the CPU model."""

from __future__ import annotations

import os
import subprocess
from collections import Counter

import pytest
from omegaconf import OmegaConf

from lab import plan
from spp.paths import REPO_ROOT

TABLES = ("table2_zeroshot", "table3_75pct", "table4_lora_star", "table5_mmlu", "table6_ablations")



def sweeps(table: str, model: str) -> list[list[str]]:
    """The override lists ``run.sh`` would pass to ``train.py -m`` (bash expands them; nothing runs)."""
    knobs = ("DRY", "EXTRA", "LOGGERS", "RUNS", "PRUNERS", "SPARSITIES", "SEEDS", "LIMIT", "MMLU_LIMIT")
    env = {k: v for k, v in os.environ.items() if k not in knobs}
    env.update(PRINT_SWEEPS="1", MODEL=model)
    proc = subprocess.run(["bash", str(REPO_ROOT / "experiments" / table / "run.sh")], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return [line.split("\x1f") for line in proc.stdout.splitlines() if line]


def jobs(table: str, model: str) -> list:
    return [cfg for sweep in sweeps(table, model) for _, cfg in plan.plan(sweep)]


def _settings(cfg) -> tuple:
    a = cfg.adapter  # each method's own keys: adapter=none has no r, lora no use_beta
    return (cfg.pruner.name, cfg.sparsity.name, a.name, *(a.get(k) for k in ("r", "use_beta", "alpha_init",
                                                                              "beta_init", "residual")))


@pytest.mark.parametrize("table", TABLES)
def test_llama7b_sweeps_compose_with_paper_settings(table):
    cfgs = jobs(table, "llama7b")
    expected = {"table2_zeroshot": 9, "table3_75pct": 6, "table4_lora_star": 4, "table5_mmlu": 9,
                "table6_ablations": 32}[table]
    assert len(cfgs) == expected
    assert len({_settings(c) for c in cfgs}) == expected, "every job of a table is a distinct setting"
    for cfg in cfgs:
        assert cfg.model.name == "llama7b" and cfg.trainer.lr == 4e-3 and cfg.trainer.max_epochs == 3
        assert cfg.data.train_batch_size == 8 and cfg.data.max_examples is None
        assert cfg.logger.wandb.group == table and table in cfg.logger.wandb.tags
        assert cfg.eval.name == "paper" and cfg.eval.limit is None
        assert list(cfg.eval.tasks) == (["spp_mmlu"] if table == "table5_mmlu" else ["spp_zeroshot"])


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_table_specific_settings_on_the_cpu_model():
    t3 = Counter((c.pruner.name, c.sparsity.name, c.adapter.name) for c in jobs("table3_75pct", "smollm2_135m"))
    assert t3 == Counter({(p, s, a): 1 for s in ("unstructured75", "nm2_8")
                          for p, a in (("wanda", "none"), ("dsnot", "none"), ("wanda", "spp"))})
    t4 = Counter((c.adapter.name, c.adapter.r, c.adapter.get("lora_alpha"), c.trainer.lr)
                 for c in jobs("table4_lora_star", "smollm2_135m"))
    # both methods at the budget's lr and at two more each, at unstructured 75 % and 2:8
    grids = (("lora", 8, (2e-3, 5e-3, 2e-2)), ("spp", 16, (1e-2, 2e-2, 5e-2)))  # SPP has no lora_alpha
    assert t4 == Counter({(a, r, 16.0 if a == "lora" else None, lr): 2 for a, r, lrs in grids for lr in lrs})
    t6 = jobs("table6_ablations", "smollm2_135m")
    assert sorted(_settings(c)[2:] for c in t6) == sorted([
        ("none", None, None, None, None, None),  # adapter=none has no adapter keys
        ("spp", 4, True, "kaiming", "zeros", True),
        ("spp", 8, True, "kaiming", "zeros", True),
        ("spp", 16, True, "kaiming", "zeros", True),
        ("spp", 16, False, "zeros", "zeros", True),
        ("spp", 16, True, "kaiming", "kaiming", True),
        ("spp", 16, True, "zeros", "kaiming", True),
        ("spp", 16, True, "kaiming", "zeros", False),
    ])
    for cfg in t6:  # the one CPU budget (conf/budget/smollm2_135m.yaml), as the README main job
        assert (cfg.data.max_examples, cfg.data.max_length, cfg.data.train_batch_size) == (120, 128, 8)
        assert (cfg.trainer.max_steps, cfg.trainer.lr, cfg.eval.seqlen, cfg.eval.max_windows) == (-1, 2e-2, 512, 40)
        assert cfg.pruner.name == "wanda" and cfg.sparsity.name == "nm2_4" and list(cfg.eval.tasks) == []
    t2 = jobs("table2_zeroshot", "smollm2_135m")
    assert [(c.pruner.name, c.sparsity.name, c.adapter.name) for c in t2][0] == ("none", "dense", "none")
    assert all(c.eval.limit == 20 and list(c.eval.tasks) == ["spp_zeroshot"] for c in t2) and len(t2) == 5


def test_plan_rejects_a_misspelled_key_and_prints_the_job_config(capsys):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="adapter.rr"):
        plan.plan(["model=llama7b", "adapter.rr=4,8"])
    with pytest.raises(ValueError, match="adapter.dropout"):
        plan.plan(["model=llama7b", "adapter.dropout=1.5"])
    assert plan.main(["--cfg", "model=llama13b", "pruner=sparsegpt", "sparsity=unstructured50", "adapter.r=4,8",
                      "hydra.sweep.dir=/tmp/never"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# 2 job(s): python train.py -m model=llama13b")
    assert "[1] model=llama13b pruner=sparsegpt sparsity=unstructured50 adapter.r=8" in out
    docs = [d for d in out.split("\n\n") if "adapter:" in d]
    assert len(docs) == 2
    cfg = OmegaConf.create(docs[1][docs[1].index("model:"):])
    assert cfg.model.name == "llama13b" and cfg.adapter.r == 8 and cfg.trainer.lr == 2e-3
