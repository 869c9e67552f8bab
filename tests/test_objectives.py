"""Training objectives (``spp.training.objectives``): distillation's terms in float64 against independent formulas
written here, their gradients, the config checks, the teacher's forward and block outputs, and the registry."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from spp.errors import UserError
from spp.training.objectives import ObjectiveConfig, build_objective, get_objective, objective_names
from spp.training.objectives.ce import CEConfig
from spp.training.objectives.distill import DistillConfig
from spp.training.objectives.distill.loss import feature_l2, logit_kl, loss_positions

B, S, V, H, L = 3, 6, 11, 5, 4


def _labels(generator: torch.Generator) -> torch.Tensor:
    """Labels with -100 where a prompt or padding would be (every row scores at least one position)."""
    labels = torch.randint(0, V, (B, S), generator=generator)
    labels[0, :2] = -100   # a prompt not trained on
    labels[1, 4:] = -100   # right padding
    labels[2, 0] = -100    # the first token of a sequence is never a target
    return labels


def _reference_kl(z_s: torch.Tensor, z_t: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · mean over positions i whose next label is not -100 of Σ_v p_t (log p_t − log p_s), token by token."""
    terms = []
    for b in range(labels.shape[0]):
        for i in range(labels.shape[1] - 1):
            if labels[b, i + 1] == -100:
                continue
            log_s = torch.log_softmax(z_s[b, i] / temperature, dim=-1)
            log_t = torch.log_softmax(z_t[b, i] / temperature, dim=-1)
            terms.append(torch.sum(torch.exp(log_t) * (log_t - log_s)))
    return torch.stack(terms).mean() * temperature**2


def _reference_feature(h_s: list[torch.Tensor], h_t: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """Mean over blocks of Σ_i ‖h_s,i − h_t,i‖² / Σ_i ‖h_t,i‖² over the same positions, token by token."""
    ratios = []
    for s, t in zip(h_s, h_t, strict=True):
        num = den = torch.zeros((), dtype=torch.float64)
        for b in range(labels.shape[0]):
            for i in range(labels.shape[1] - 1):
                if labels[b, i + 1] != -100:
                    num = num + torch.dot(s[b, i] - t[b, i], s[b, i] - t[b, i])
                    den = den + torch.dot(t[b, i], t[b, i])
        ratios.append(num / den)
    return torch.stack(ratios).mean()


def test_loss_positions_are_the_positions_the_cross_entropy_scores():
    labels = torch.tensor([[-100, -100, 5, 6, -100], [1, 2, 3, 4, 5]])
    assert loss_positions(labels).tolist() == [[False, True, True, False, False], [True, True, True, True, False]]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_logit_kl_equals_the_independent_formula_in_float64(temperature: float):
    g = torch.Generator().manual_seed(0)
    z_s, z_t = (torch.randn(B, S, V, generator=g, dtype=torch.float64) * 3 for _ in range(2))
    labels = _labels(g)
    got = logit_kl(z_s, z_t, loss_positions(labels), temperature)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, _reference_kl(z_s, z_t, labels, temperature), rtol=1e-13, atol=1e-15)
    assert float(logit_kl(z_t, z_t, loss_positions(labels), temperature)) == pytest.approx(0.0, abs=1e-15)


def test_feature_term_equals_the_normalised_l2_computed_directly_in_float64():
    g = torch.Generator().manual_seed(1)
    h_s = [torch.randn(B, S, H, generator=g, dtype=torch.float64) for _ in range(L)]
    h_t = [torch.randn(B, S, H, generator=g, dtype=torch.float64) for _ in range(L)]
    labels = _labels(g)
    got = feature_l2(h_s, h_t, loss_positions(labels))
    torch.testing.assert_close(got, _reference_feature(h_s, h_t, labels), rtol=1e-13, atol=1e-15)
    assert float(feature_l2(h_t, h_t, loss_positions(labels))) == 0.0
    with pytest.raises(ValueError, match="one output per block"):
        feature_l2(h_s[:-1], h_t, loss_positions(labels))


def test_nothing_scored_gives_zero_not_nan():
    z = torch.randn(2, 4, V, dtype=torch.float64, requires_grad=True)
    none = torch.full((2, 4), -100)
    kl = logit_kl(z, torch.randn(2, 4, V, dtype=torch.float64), loss_positions(none))
    feat = feature_l2([z], [torch.randn(2, 4, V, dtype=torch.float64)], loss_positions(none))
    assert float(kl.detach()) == 0.0 and float(feat.detach()) == 0.0
    (kl + feat).backward()
    assert torch.count_nonzero(z.grad) == 0


def test_gradients_match_finite_differences():
    """``torch.autograd.gradcheck`` (central differences, float64) of both terms w.r.t. the student's tensors."""
    g = torch.Generator().manual_seed(2)
    z_s = torch.randn(2, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    z_t = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    labels = torch.tensor([[-100, 1, 2, 3], [4, 0, -100, 2]])
    mask = loss_positions(labels)
    assert torch.autograd.gradcheck(lambda z: logit_kl(z, z_t, mask, 1.7), (z_s,))
    h_s = [torch.randn(2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    h_t = [torch.randn(2, 4, 3, generator=g, dtype=torch.float64) for _ in range(2)]
    assert torch.autograd.gradcheck(lambda a, b: feature_l2([a, b], h_t, mask), tuple(h_s))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("temperature", 0.0, "objective.temperature=0.0 must be a finite number > 0"),
    ("temperature", math.inf, "objective.temperature=inf"),
    ("kl_weight", -1.0, "objective.kl_weight=-1.0 must be a finite number >= 0"),
    ("ce_weight", math.nan, "objective.ce_weight=nan"),
])
def test_distill_config_refuses_bad_values(key: str, value: float, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        DistillConfig(**{key: value})
    with pytest.raises(ValueError, match="nothing to distil"):
        DistillConfig(kl_weight=0.0, feature_weight=0.0)


def test_registry_and_teacher_needs():
    assert {"ce", "distill"} <= set(objective_names())
    assert not build_objective(None).needs_teacher and not build_objective(CEConfig()).needs_teacher
    assert build_objective(DistillConfig()).needs_teacher
    assert DistillConfig().teacher_outputs == "block_outputs"
    assert DistillConfig(feature_weight=0.0).teacher_outputs == "logits"
    assert ObjectiveConfig().teacher_outputs == "none"
    with pytest.raises(UserError, match="objective.name='nope' is not a registered training objective"):
        get_objective("nope")


# --------------------------------------------------------------------------- on a real (tiny) causal LM
def _tiny_lm(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(cfg).double().eval()


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (B, S), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 4:] = 0
    labels = ids.clone()
    labels[attention == 0] = -100
    labels[0, :2] = -100
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def test_ce_objective_is_the_models_own_loss_bitwise():
    model, batch = _tiny_lm(), _batch()
    got = build_objective(CEConfig()).loss(model, batch)
    assert torch.equal(got.loss, model(**batch, use_cache=False).loss) and got.parts == {}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_distill_on_a_model_reads_logits_and_block_outputs(checkpointing: bool):
    """Against the formulas above on the models' own logits and block outputs (taken with plain hooks here); a
    student equal to its teacher has zero loss; block outputs are recorded once per forward, also when activation
    checkpointing recomputes the blocks in backward."""
    teacher, batch = _tiny_lm(0), _batch()
    student = copy.deepcopy(teacher).train()
    objective = build_objective(DistillConfig(temperature=2.0, feature_weight=0.5, ce_weight=0.25), LlamaDecoderLayer)
    same = objective.loss(student, batch, teacher)
    assert float(same.parts["kl"]) == pytest.approx(0.0, abs=1e-14) and float(same.parts["feature"]) == 0.0
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    if checkpointing:
        student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    seen: dict[str, list[torch.Tensor]] = {"student": [], "teacher": []}
    for name, model in (("student", student), ("teacher", teacher)):
        for block in model.model.layers:
            block.register_forward_hook(lambda _m, _a, out, n=name: seen[n].append(out[0] if isinstance(out, tuple)
                                                                                   else out))
    out = objective.loss(student, batch, teacher)
    z_s = student(**batch, use_cache=False).logits.detach()
    z_t = teacher(**batch, use_cache=False).logits
    kl = _reference_kl(z_s, z_t, batch["labels"], 2.0)
    feat = _reference_feature(seen["student"][:3], seen["teacher"][:3], batch["labels"])
    ce = student(**batch, use_cache=False).loss
    torch.testing.assert_close(out.parts["kl"], kl, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out.parts["feature"], feat.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out.loss.detach(), kl + 0.5 * feat.detach() + 0.25 * ce.detach(), rtol=1e-12, atol=0)
    out.loss.backward()  # recomputation under checkpointing must not record blocks again
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())


def test_distill_without_a_teacher_says_so():
    with pytest.raises(RuntimeError, match="needs the dense teacher"):
        build_objective(DistillConfig(), LlamaDecoderLayer).loss(_tiny_lm(), _batch(), None)
