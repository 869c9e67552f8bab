"""LoSA (``adapter=losa``, Huang et al., ICLR 2025): the merged weight keeps exactly the pruned zero pattern
(unstructured and 2:4); the per-block ranks follow the paper's allocation (checked against a computation written
here, with negative controls); the block errors are the reference's normalised output error; a few steps on the
tiny model lower the loss; ``train.py adapter=losa`` runs end to end; the plan counts what ``inject`` trains."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from train_helpers import tiny_job

from spp.adapters.methods.losa.allocation import allocate_ranks, block_errors
from spp.adapters.methods.sparse_lora.layer import sparse_lora_layers
from spp.adapters.registry import apply_adapter, get_method, make_config, merge_adapter, option_config
from spp.models import load_model
from spp.models.conv1d import linearize_conv1d
from spp.models.loading import load_tokenizer
from spp.models.tiny import TINY_FAMILIES, tiny_config, tiny_model
from spp.planning.adapter import adapter_spec
from spp.planning.shapes import shape_from_arch
from spp.projections import DEFAULT_TARGETS, find_projections
from spp.pruning.calibration_data import draw_calibration
from spp.pruning.patterns import check_nm, keep_top_n_of_m
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.phase import get_or_reconstruct

BLOCKS = 4


def pruned(kind: str, seed: int = 0, blocks: int = BLOCKS) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The tiny LLaMA with ``blocks`` blocks, its projections magnitude-pruned (``"unstructured"`` 50 % per row, or
    ``"2:4"``); the masks (True = kept)."""
    model = tiny_model(seed=seed, num_hidden_layers=blocks)
    masks = {}
    with torch.no_grad():
        for name, linear in find_projections(model, DEFAULT_TARGETS).items():
            score = linear.weight.abs()
            if kind == "2:4":
                mask = keep_top_n_of_m(score, 2, 4)
            else:
                mask = score >= score.median(dim=1, keepdim=True).values
            linear.weight.mul_(mask)
            masks[name] = mask
    return model, masks


def randomize_b(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-zero ``B`` everywhere (peft starts it at 0, where every update is 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in sparse_lora_layers(model):
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=gen) * 0.1)


# ------------------------------------------------------------------------------------------------ allocation


def paper_ranks(errors: list[float], mean: int, floor: int, ceiling: int) -> list[int]:
    """The paper's rule written independently: shares ``L r̄ E_l / ΣE`` rounded half to even and clipped, then a
    rank at a time off the smallest-error blocks (surplus) or onto the largest-error ones (deficit)."""
    budget = len(errors) * mean
    total = sum(errors)
    ranks = []
    for e in errors:
        share = budget * e / total if total else float(mean)
        ranks.append(min(ceiling, max(floor, round(share))))  # Python's round is half to even, as numpy's
    by_error = sorted(range(len(errors)), key=lambda i: (errors[i], -i))  # ascending error; ties: later first
    while sum(ranks) != budget:  # passes over the blocks, each moved at most once a pass (the reference's loop)
        surplus = sum(ranks) > budget
        for i in by_error if surplus else reversed(by_error):
            if surplus and sum(ranks) > budget and ranks[i] > floor:
                ranks[i] -= 1
            elif not surplus and sum(ranks) < budget and ranks[i] < ceiling:
                ranks[i] += 1
    return ranks


def monotone(errors: list[float], ranks: list[int]) -> bool:
    """A block with a larger error never gets a smaller rank."""
    return all(ranks[i] >= ranks[j] for i in range(len(errors)) for j in range(len(errors)) if errors[i] > errors[j])


CASES = [
    ([1.0, 3.0, 0.5, 0.5], 4, 1, 8),
    ([0.01, 0.02, 0.2, 5.0, 0.3, 0.3, 0.04, 1.0], 8, 1, 16),  # clipped at both ends, repaired
    ([2.0, 2.0, 2.0], 6, 1, 12),
    ([0.0, 0.0, 7.0, 1.0, 1.0, 3.0], 3, 2, 5),
]


@pytest.mark.parametrize(("errors", "mean", "floor", "ceiling"), CASES)
def test_ranks_match_the_papers_rule_and_keep_the_budget(errors, mean, floor, ceiling):
    ranks = allocate_ranks(errors, mean, floor, ceiling)
    assert ranks == paper_ranks(errors, mean, floor, ceiling)
    assert sum(ranks) == len(errors) * mean
    assert all(floor <= r <= ceiling for r in ranks)
    assert monotone(errors, ranks)


def test_allocation_negative_controls():
    """Equal or all-zero errors give the mean everywhere; a rule ranking by inverse error (or uniform ranks) is
    caught by the checks above; an infeasible budget or a bad error is refused in one line."""
    assert allocate_ranks([3.0] * 5, 4, 1, 8) == [4] * 5
    assert allocate_ranks([0.0] * 3, 4, 1, 8) == [4] * 3
    errors = [1.0, 3.0, 0.5, 0.5]
    ranks = allocate_ranks(errors, 4, 1, 8)
    assert ranks != [4] * 4 and not monotone(errors, ranks[::-1])
    inverse = allocate_ranks([1 / e for e in errors], 4, 1, 8)
    assert not monotone(errors, inverse) and inverse != paper_ranks(errors, 4, 1, 8)
    with pytest.raises(ValueError, match="mean rank 9"):
        allocate_ranks(errors, 9, 1, 8)
    with pytest.raises(ValueError, match="finite and >= 0"):
        allocate_ranks([1.0, -1.0], 4, 1, 8)


def test_config_refuses_bad_keys():
    with pytest.raises(ValueError, match="rank_min"):
        make_config("losa", r=4, rank_min=5)
    with pytest.raises(ValueError, match="rank_max"):
        make_config("losa", r=8, rank_max=4)
    with pytest.raises(ValueError, match="block_errors"):
        make_config("losa", block_errors=[1.0, float("nan")])
    model, masks = pruned("unstructured")
    with pytest.raises(ValueError, match="has 3 entries but the model has 4 decoder blocks"):
        apply_adapter(model, make_config("losa", block_errors=[1.0, 2.0, 3.0]), masks)


def test_each_layer_gets_its_blocks_rank_and_one_scaling():
    model, masks = pruned("unstructured")
    errors = [1.0, 3.0, 0.5, 0.5]
    cfg = option_config("losa", r=4, block_errors=errors)
    adapted, _ = apply_adapter(model, cfg, masks)
    expected = allocate_ranks(errors, 4, 1, 8)
    layers = dict(sparse_lora_layers(adapted))
    assert len(layers) == 7 * BLOCKS
    for name, layer in layers.items():
        block = int(name.split(".")[2])
        assert layer.lora_A["default"].weight.shape[0] == layer.lora_B["default"].weight.shape[1] == expected[block]
        assert layer.scaling["default"] == cfg.lora_alpha / cfg.r  # alpha / r whatever the layer's rank
    assert len(set(expected)) > 1


# ------------------------------------------------------------------------------------------------ zeros


@pytest.mark.parametrize("kind", ["unstructured", "2:4"])
def test_merged_weight_has_exactly_the_pruned_zero_pattern(kind):
    model, masks = pruned(kind)
    cfg = make_config("losa", r=4, block_errors=[1.0, 3.0, 0.5, 0.5])
    before = {n: m.weight.detach().clone() for n, m in find_projections(model, DEFAULT_TARGETS).items()}
    adapted, _ = apply_adapter(model, cfg, masks)
    randomize_b(adapted)
    unmasked = {n: (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).detach()
                for n, layer in sparse_lora_layers(adapted)}
    plain, stats = merge_adapter(adapted, cfg, masks)
    assert stats["pruned_nonzero"] == 0 and stats["delta_sq_norm"] > 0
    after = {n: m.weight for n, m in find_projections(plain, DEFAULT_TARGETS).items()}
    for name, weight in after.items():
        assert torch.equal(weight == 0, ~masks[name]), name  # the pruned zeros, bit for bit, and no others
        assert torch.equal(weight.view(torch.int32)[~masks[name]], before[name].view(torch.int32)[~masks[name]])
        assert not torch.equal(weight[masks[name]], before[name][masks[name]])  # the kept weights did change
        assert (unmasked[name][~masks[name]] != 0).any()  # negative control: unmasked, the update fills zeros
        if kind == "2:4":
            assert check_nm(weight, 2, 4).valid


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_every_tiny_family_merges_with_unequal_ranks_and_every_zero(family):
    """The architecture matrix's families (GPT-2's Conv1D, Phi-3's fused projections, OPT's biases, ...): each block's
    layers get its rank and the merge keeps exactly the pruned zeros."""
    model = tiny_model(seed=0, model_type=family)
    linearize_conv1d(model)
    masks = {}
    with torch.no_grad():
        for name, linear in find_projections(model, DEFAULT_TARGETS).items():
            score = linear.weight.abs()
            masks[name] = score >= score.median(dim=1, keepdim=True).values
            linear.weight.mul_(masks[name])
    cfg = make_config("losa", r=4, block_errors=[1.0, 3.0], dropout=0.0)
    adapted, _ = apply_adapter(model, cfg, masks)
    randomize_b(adapted)
    ranks = {name: layer.r["default"] for name, layer in sparse_lora_layers(adapted)}
    assert set(ranks) == set(masks) and sorted(set(ranks.values())) == allocate_ranks([1.0, 3.0], 4, 1, 8) == [2, 6]
    plain, stats = merge_adapter(adapted, cfg, masks)
    assert stats["pruned_nonzero"] == 0 and stats["delta_sq_norm"] > 0
    for name, linear in find_projections(plain, DEFAULT_TARGETS).items():
        assert torch.equal(linear.weight == 0, ~masks[name]), (family, name)


# ------------------------------------------------------------------------------------------------ errors


def hidden_state_errors(dense: torch.nn.Module, sparse: torch.nn.Module, ids: torch.Tensor) -> list[float]:
    """The reference's normalised error computed from ``output_hidden_states`` (block ``l``'s output is hidden state
    ``l + 1``; the last block's is left out, as transformers normalises it)."""
    with torch.no_grad():
        f = dense(input_ids=ids, output_hidden_states=True).hidden_states
        g = sparse(input_ids=ids, output_hidden_states=True).hidden_states
    out = []
    for layer in range(len(f) - 2):
        d, s = f[layer + 1].double(), g[layer + 1].double()
        norm = d.reshape(-1, d.shape[-1]).t().norm(p=2, dim=1)
        out.append(float((((d - s) / norm) ** 2).sum() / d.shape[-1]))
    return out


def test_block_errors_are_the_references_normalised_output_error():
    dense = tiny_model(seed=0, num_hidden_layers=BLOCKS)
    sparse, _ = pruned("unstructured")
    ids = torch.randint(4, 200, (3, 16), generator=torch.Generator().manual_seed(0))
    errors = block_errors(dense, sparse, [ids[:2], ids[2:]])
    assert len(errors) == BLOCKS and all(e > 0 for e in errors)
    assert errors[:-1] == pytest.approx(hidden_state_errors(dense, sparse, ids), rel=1e-9)
    assert block_errors(dense, copy.deepcopy(dense), [ids]) == [0.0] * BLOCKS  # negative control: nothing pruned
    harder, _ = pruned("2:4")  # a different pattern gives different errors
    assert block_errors(dense, harder, [ids]) != pytest.approx(errors)


# ------------------------------------------------------------------------------------------------ training


def test_a_few_steps_lower_the_loss_and_keep_every_zero():
    dense = tiny_model(seed=0, num_hidden_layers=BLOCKS)
    model, masks = pruned("unstructured")
    ids = torch.randint(4, 200, (4, 16), generator=torch.Generator().manual_seed(0))
    cfg = make_config("losa", r=4, dropout=0.0, block_errors=block_errors(dense, model, [ids]))
    adapted, trainable = apply_adapter(model, cfg, masks)
    assert trainable and all("lora_" in n for n in trainable)
    opt = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-2)
    adapted.train()
    losses = []
    for _ in range(8):
        loss = adapted(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    plain, stats = merge_adapter(adapted, cfg, masks)
    assert stats["pruned_nonzero"] == 0
    for name, weight in ((n, m.weight) for n, m in find_projections(plain, DEFAULT_TARGETS).items()):
        assert torch.equal(weight == 0, ~masks[name])


@pytest.mark.parametrize("errors", [[1.0, 3.0, 0.5, 0.5], [1.0, 3.0]], ids=["4-blocks", "2-blocks"])
def test_adapter_files_reload_with_their_ranks(tmp_path, errors):
    """Reload from peft's files; with 2 blocks (14 layers, under peft's 20) ``target_modules`` are saved as full
    paths, which the loader maps back to in-block names."""
    model, masks = pruned("unstructured", blocks=len(errors))
    base = copy.deepcopy(model)
    cfg = make_config("losa", r=4, block_errors=errors)
    adapted, _ = apply_adapter(model, cfg, masks)
    randomize_b(adapted)
    method = get_method("losa")
    method.save(adapted, tmp_path, {})
    loaded, loaded_cfg = method.load(base, tmp_path, masks)
    assert loaded_cfg.name == "losa" and loaded_cfg.r == 4
    assert sorted(t.rsplit(".", 1)[-1] for t in loaded_cfg.targets) == sorted(DEFAULT_TARGETS)  # in-block names
    ids = torch.randint(4, 200, (2, 10), generator=torch.Generator().manual_seed(1))
    adapted.eval()
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, adapted(input_ids=ids).logits)


@pytest.mark.parametrize("name", ["losa", "sparse_lora"])
def test_a_damaged_or_missing_settings_file_is_one_line_naming_it(tmp_path, name):
    """Both methods read ``sparse_lora.json`` through the adapters' one JSON reader; an intact folder loads."""
    from spp.adapters.base import DAMAGED_FIX
    from spp.adapters.methods.sparse_lora.layer import META_NAME
    from spp.errors import UserError

    model, masks = pruned("unstructured", blocks=2)
    method = get_method(name)
    method.save(apply_adapter(copy.deepcopy(model), make_config(name, r=4, block_errors=[1.0, 2.0])
                              if name == "losa" else make_config(name, r=4), masks)[0], tmp_path, {})
    assert method.load(copy.deepcopy(model), tmp_path, masks)[1].name == name  # negative control
    meta = tmp_path / META_NAME
    meta.write_text(meta.read_text()[:40])  # cut short, as an interrupted copy leaves it
    with pytest.raises(UserError, match=f"{meta} is damaged \\(not valid JSON") as err:
        method.load(copy.deepcopy(model), tmp_path, masks)
    assert DAMAGED_FIX in str(err.value) and "\n" not in str(err.value)
    meta.unlink()  # missing: LoSA refuses in one line; SparsePEFT loads peft's own SPARSE_LORA folder unchecked
    if name == "losa":
        with pytest.raises(UserError, match=f"No {META_NAME} in .*adapter=losa"):
            method.load(copy.deepcopy(model), tmp_path, masks)
    else:
        assert method.load(copy.deepcopy(model), tmp_path, masks)[1].name == name


# ------------------------------------------------------------------------------------------------ plan, train.py


def test_the_plan_counts_the_trainable_values_of_inject():
    """The plan builds 1- and 2-block skeletons and extrapolates; LoSA's ranks sum to ``L r``, so the count of a
    4-block model with unequal ranks is the plan's (and LoRA*'s at the same r)."""
    cfg = make_config("losa", r=4, block_errors=[1.0, 3.0, 0.5, 0.5])
    model, masks = pruned("unstructured")
    adapted, _ = apply_adapter(model, cfg, masks)
    injected = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    arch = {**tiny_config(num_hidden_layers=BLOCKS).to_dict(), "num_hidden_layers": BLOCKS}
    shape = shape_from_arch("tiny", arch, list(DEFAULT_TARGETS), 4)
    assert adapter_spec(cfg, arch, shape, "float32").trainable == injected
    assert adapter_spec(make_config("lora", r=4), arch, shape, "float32").trainable == injected
    assert adapter_spec(make_config("lora", r=5), arch, shape, "float32").trainable != injected  # control


def test_train_py_measures_the_block_errors_after_pruning(tmp_path):
    """``train.py adapter=losa`` without ``block_errors``: the pruning phase keeps the dense model, LoSA measures
    each block's error on the calibration windows (as :func:`block_errors` does here on the same pruned model) and
    the ranks follow them."""
    from train import run_job

    job = tiny_job(tmp_path, "adapter=losa", "adapter.r=4", "adapter.error_windows=2", "trainer.max_steps=2",
                   "data.max_examples=12", "dense_ppl=false", "pruned_ppl=false")
    assert job.adapter.block_errors is None
    summary = run_job(job)
    errors = job.adapter.block_errors
    assert errors is not None and len(errors) == 2 and all(e > 0 for e in errors)
    assert summary["config"]["adapter"]["block_errors"] == pytest.approx(errors)
    windows = draw_calibration(load_tokenizer(job.model), job.calibration, job.data_dir).windows[:2]
    dense = load_model(job.model, with_tokenizer=False)[0]
    sparse = copy.deepcopy(dense)
    get_or_reconstruct(sparse, load_tokenizer(job.model), job.model, job.pruner, job.sparsity, job.calibration,
                       ReconstructConfig(), cache_dir=job.cache_dir,
                       data_dir=job.data_dir)  # in place, from the run's cache entry
    expected = block_errors(dense, sparse, list(windows.split(job.calibration.batch_size)))
    assert errors == pytest.approx(expected, rel=1e-6)
    marker = json.loads((tmp_path / "run" / "adapter" / "adapter_method.json").read_text())
    assert marker["config"]["block_errors"] == pytest.approx(errors)
    saved = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    ranks = allocate_ranks(errors, 4, 1, 8)
    assert sorted(saved["rank_pattern"].values()) == sorted([ranks[0]] * 7 + [ranks[1]] * 7)


def test_only_losa_without_errors_asks_for_the_dense_model():
    """The pipeline keeps a dense copy only for a config whose errors are still to be measured; other methods never
    ask (negative control)."""
    losa = get_method("losa")
    assert losa.needs_dense(make_config("losa")) is True
    assert losa.needs_dense(make_config("losa", block_errors=[1.0, 2.0])) is False
    assert not any(get_method(n).needs_dense(make_config(n)) for n in ("sparse_lora", "lora", "spp"))


def test_train_py_adapter_losa_runs_end_to_end(tmp_path):
    """``train.py adapter=losa`` on the tiny config (2 blocks, Wanda 2:4): trains, merges with every zero kept."""
    from train import run_job

    job = tiny_job(tmp_path, "adapter=losa", "adapter.r=4", "adapter.block_errors=[0.2,1.0]", "trainer.lr=0.05",
                   "trainer.max_steps=6", "data.max_examples=24", "adapter.dropout=0.0", "dense_ppl=false")
    summary = run_job(job)
    assert summary["config"]["adapter"]["name"] == "losa"
    assert summary["config"]["adapter"]["block_errors"] == [0.2, 1.0]
    assert summary["losses"]["train_last"] < summary["losses"]["train_first"]
    sp = summary["sparsity"]
    assert sp["before"] == sp["after"] == 0.5 and sp["audits"][-1]["when"] == "merged"
    h, i, kv = 64, 128, 32
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    assert summary["params"]["trainable"] == 2 * 4 * sum(m + n for m, n in shapes)  # ranks 1 and 7: mean 4
    saved = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert sorted(set(saved["rank_pattern"].values())) == [1, 7]
