"""2:4 export checks that run without a GPU: pattern validation and the clear CPU refusal."""

from __future__ import annotations

import pytest
import torch
from spp_helpers import prune_2_4_

from spp import inject, merge_and_unload, spp_layers
from spp.export.semi_structured import count_2_4_violations, export_semi_structured
from spp.models.tiny import tiny_llama


def test_pattern_check_counts_bad_groups():
    w = torch.tensor([[1.0, 0.0, 2.0, 0.0, 1.0, 1.0, 1.0, 0.0]])
    assert count_2_4_violations(w) == 1
    w[0, 5] = 0.0
    assert count_2_4_violations(w) == 0
    with pytest.raises(ValueError, match="divisible by 4"):
        count_2_4_violations(torch.ones(2, 6))


def test_merged_2_4_model_stays_2_4_and_export_refuses_on_cpu(monkeypatch):
    model = tiny_llama(seed=0)
    prune_2_4_(model)
    inject(model, r=16)
    with torch.no_grad():
        for layer in spp_layers(model).values():
            layer.spp_beta.normal_()
    with pytest.raises(ValueError, match="merge the adapters first"):
        export_semi_structured(model)
    merge_and_unload(model)
    assert all(count_2_4_violations(m.weight) == 0 for n, m in model.named_modules() if n.endswith("_proj"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        export_semi_structured(model, targets=("q_proj", "o_proj"))
    dense = tiny_llama(seed=0)
    with pytest.raises(ValueError, match="not 2:4"):
        export_semi_structured(dense)


def test_export_rejects_small_shapes():
    holder = torch.nn.Module()
    holder.proj = torch.nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        holder.proj.weight[:, 1::2] = 0.0
    with pytest.raises(ValueError, match=r"proj: shape \(16, 64\) is not a multiple of \(32, 64\)"):
        export_semi_structured(holder, targets=("proj",))
