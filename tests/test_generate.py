"""``generate.py`` and :func:`spp.generation.generate_text` on the tiny model: greedy output equals the model's
own argmax decoding and ``model.generate``; sampling is seeded; ``sparse24=true`` is refused on CPU and for a
model that is not 2:4 (one ``generate.py: error:`` line); on a CUDA machine the 2:4 path runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spp.data.prompts import user_prompt
from spp.export.semi_structured import count_2_4_violations
from spp.generation import GenerateJobConfig, format_prompt, generate_text, to_sparse24
from spp.models import tiny_llama, tiny_tokenizer
from spp.paths import REPO_ROOT
from spp.projections import DEFAULT_TARGETS

PROMPT = "Name a primary colour."


def _prune_2_4(model: torch.nn.Module) -> torch.nn.Module:
    """Keep the 2 largest |w| of every 4 consecutive inputs in each target projection (magnitude 2:4)."""
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in DEFAULT_TARGETS:
                w = mod.weight.view(mod.weight.shape[0], -1, 4)
                drop = w.abs().argsort(dim=-1)[..., :2]
                w.scatter_(-1, drop, 0.0)
                assert count_2_4_violations(mod.weight) == 0
    return model


def _save(model: torch.nn.Module, path: Path) -> Path:
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _generate_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "generate.py", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _argmax_decode(model: torch.nn.Module, ids: torch.Tensor, n: int, eos: int) -> list[int]:
    """Greedy decoding written out: full forward (no KV cache) and argmax of the last position, n times."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_greedy_cli_equals_in_memory_model(tmp_path):
    model_dir = _save(tiny_llama(seed=0), tmp_path / "tiny")
    out = tmp_path / "gen" / "generation.json"
    proc = _generate_cli(f"model.path={model_dir}", f"prompt={PROMPT}", "max_new_tokens=12", "device=cpu",
                        f"run_dir={out.parent}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(out.read_text())
    model, tok = tiny_llama(seed=0), tiny_tokenizer()
    ids = tok(user_prompt(PROMPT), return_tensors="pt")["input_ids"]
    assert record["text"] == user_prompt(PROMPT)  # Alpaca template on by default
    with torch.no_grad():
        reference = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    expected = reference[0, ids.shape[1]:].tolist()
    assert record["token_ids"] == expected
    assert record["token_ids"] == _argmax_decode(model, ids, 12, tok.eos_token_id)
    assert record["new_tokens"] == len(expected) > 0 and not record["sampled"]
    assert record["tokens_per_s"] > 0
    assert "tokens/s (greedy, cpu, float32)" in proc.stdout
    assert record["completion"] in proc.stdout


def test_generate_text_library_and_sampling(tiny_model, tiny_tok):
    greedy = generate_text(tiny_model, tiny_tok, PROMPT, max_new_tokens=8)
    ids = tiny_tok(user_prompt(PROMPT), return_tensors="pt")["input_ids"]
    assert greedy.token_ids == _argmax_decode(tiny_model, ids, 8, tiny_tok.eos_token_id)
    raw = generate_text(tiny_model, tiny_tok, PROMPT, max_new_tokens=4, template="none")
    assert raw.text == PROMPT
    state = torch.get_rng_state()
    a = generate_text(tiny_model, tiny_tok, PROMPT, max_new_tokens=16, do_sample=True, temperature=1.0, seed=1)
    b = generate_text(tiny_model, tiny_tok, PROMPT, max_new_tokens=16, do_sample=True, temperature=1.0, seed=1)
    c = generate_text(tiny_model, tiny_tok, PROMPT, max_new_tokens=16, do_sample=True, temperature=1.0, seed=2)
    assert torch.equal(torch.get_rng_state(), state), "sampling must not move the caller's RNG"
    assert a.token_ids == b.token_ids and a.sampled
    assert a.token_ids != c.token_ids  # 16 draws from ~260 near-uniform tokens: equal only by a ~1e-38 chance


def test_bad_settings_name_the_key():
    """The settings ``generate_text`` is given are checked once, where ``generate.py``'s job is built."""
    with pytest.raises(ValueError, match="template='chatml'"):
        format_prompt(PROMPT, "chatml")
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        GenerateJobConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p=1.5"):
        GenerateJobConfig(do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="temperature=0"):
        GenerateJobConfig(do_sample=True, temperature=0.0)
    GenerateJobConfig(top_p=1.5, temperature=0.0)  # negative control: greedy decoding ignores both


def test_a_device_that_is_not_one_or_not_here_is_refused_before_the_weights_load():
    """``device=gpu`` (a typo) and a CUDA device the machine lacks name the key when the job is built, not in a
    traceback after the model has loaded; ``cpu`` and unset are accepted (controls)."""
    with pytest.raises(ValueError, match=r"device='gpu' is not a device; use cpu, cuda"):
        GenerateJobConfig(device="gpu")
    with pytest.raises(ValueError, match=rf"device='cuda:{torch.cuda.device_count()}' but this machine has"):
        GenerateJobConfig(device=f"cuda:{torch.cuda.device_count()}")
    assert GenerateJobConfig(device="cpu").device == "cpu" and GenerateJobConfig().device is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_sparse24_refused_on_cpu(tmp_path):
    with pytest.raises(RuntimeError, match="CUDA"):
        to_sparse24(_prune_2_4(tiny_llama(seed=0)))
    with pytest.raises(ValueError, match="layers.0.self_attn.q_proj: .* not 2:4"):
        to_sparse24(tiny_llama(seed=0))  # dense: the pattern is checked before the device
    model_dir = _save(_prune_2_4(tiny_llama(seed=0)), tmp_path / "tiny24")
    proc = _generate_cli(f"model.path={model_dir}", "sparse24=true", "max_new_tokens=4", f"run_dir={tmp_path / 'run'}")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("generate.py: error: sparse24=true: ") and "CUDA" in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
                    reason="2:4 semi-structured kernels need a CUDA GPU with compute capability 8.0+")
def test_sparse24_on_cuda_matches_dense():
    tok = tiny_tokenizer()
    dense = _prune_2_4(tiny_llama(seed=0)).to("cuda", torch.bfloat16)
    sparse = _prune_2_4(tiny_llama(seed=0))
    names = to_sparse24(sparse, torch.bfloat16)
    assert len(names) == 2 * len(DEFAULT_TARGETS)
    ids = tok(user_prompt(PROMPT), return_tensors="pt")["input_ids"].cuda()
    with torch.no_grad():
        ref, got = dense(ids).logits.float(), sparse(ids).logits.float()
    assert torch.allclose(got, ref, atol=5e-2, rtol=5e-2), (got - ref).abs().max()
    result = generate_text(sparse, tok, PROMPT, max_new_tokens=8)
    assert result.new_tokens > 0 and result.device.startswith("cuda")
