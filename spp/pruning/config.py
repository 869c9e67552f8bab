"""Structured configs of the ``pruner``, ``sparsity`` and ``calibration`` groups and the ``prune.py`` job.
N:M: N weights are KEPT in every group of M consecutive input weights of a row (``2:8`` is 75 % sparse)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from spp.job_base import CacheLockJobConfig, FabricJobConfig, Validated
from spp.models.config import ModelConfig
from spp.projections import DEFAULT_TARGETS
from spp.pruning.reconstruction.config import ReconstructConfig

SPARSITY_KINDS: tuple[str, ...] = ("dense", "unstructured", "nm")
LAYERWISE: tuple[str, ...] = ("none", "owl", "rmi")
"""``sparsity.layerwise``: one ratio for every block, or OWL's or LoSA's (RMI) per-block ratios
(``spp/pruning/layerwise.py``)."""
CALIBRATION_SOURCES: dict[str, str] = {
    "c4": "c4/c4_sample.jsonl",
    "wikitext2": "wikitext2/validation.json",
    "alpaca": "alpaca/cleaned_partial/alpaca_data_cleaned_0.json",
}
"""Named calibration sources and the data file each reads (relative to a data root, see ``spp.paths``)."""


@dataclass
class SparsityConfig(Validated):
    """Which zero pattern to produce (``conf/sparsity/*.yaml``).

    Attributes:
        name: Short name used in run names, cache keys and tables (``unstructured50``, ``nm2_4``).
        kind: ``dense`` (no pruning), ``unstructured`` (a fraction ``ratio`` of each matrix is zero) or ``nm``.
        ratio: Fraction of zeros in (0, 1) for ``unstructured``; for ``nm`` it may be left null (it is 1 - n/m).
        n: Weights KEPT in every group of ``m`` consecutive input weights of a row (``nm`` only).
        m: Group size (``nm`` only); every pruned layer's in_features must be a multiple of it.
        layerwise: ``none`` (every block at ``ratio``), ``owl`` (unstructured only: per-block ratios from each
            block's outlier ratio, with mean ``ratio``; Yin et al., ICML 2024) or ``rmi`` (unstructured only:
            ``ratio ± δ`` from each block's representation mutual information; Huang et al., ICLR 2025).
        owl_lambda: OWL's λ: the per-block ratios span 2λ around ``ratio``.
        owl_m: OWL's M: a score is an outlier above M times its block's mean.
        rmi_delta: LoSA's δ (``layerwise=rmi``): the blocks' ratios lie in ``ratio ± δ``; null: the reference's
            0.01 up to 50 % sparsity, 0.02 up to 60 %, 0.03 above.
    """

    name: str = "dense"
    kind: str = "dense"
    ratio: float | None = None
    n: int | None = None
    m: int | None = None
    layerwise: str = "none"
    owl_lambda: float = 0.08
    owl_m: float = 5.0
    rmi_delta: float | None = None

    def validate(self) -> SparsityConfig:
        """Raise ``ValueError`` naming the config key when the pattern is ill-formed; return ``self``."""
        if self.kind not in SPARSITY_KINDS:
            raise ValueError(f"sparsity.kind={self.kind!r} is not one of {SPARSITY_KINDS}")
        if self.kind == "unstructured":
            if self.ratio is None or not 0.0 < float(self.ratio) < 1.0:
                raise ValueError(
                    f"sparsity.ratio={self.ratio!r} must lie strictly between 0 and 1 for unstructured sparsity "
                    "(e.g. sparsity=unstructured sparsity.ratio=0.6)"
                )
        if self.kind == "nm":
            if self.n is None or self.m is None:
                raise ValueError(
                    f"sparsity.kind=nm needs integers sparsity.n and sparsity.m (got n={self.n}, m={self.m})"
                )
            if not 1 <= int(self.n) < int(self.m):
                raise ValueError(
                    f"sparsity n={self.n}, m={self.m} is invalid: need 1 <= n < m (n weights are KEPT in every "
                    "group of m, e.g. sparsity=nm2_4)"
                )
            if self.ratio is not None and abs(float(self.ratio) - (1 - self.n / self.m)) > 1e-9:
                raise ValueError(
                    f"sparsity.ratio={self.ratio} contradicts n={self.n}, m={self.m} (n kept of m means ratio "
                    f"{1 - self.n / self.m:g}); set sparsity.ratio=null"
                )
        return self._validate_layerwise()

    @property
    def rmi_spread(self) -> float:
        """LoSA's δ in use: ``rmi_delta``, or the reference's by target ratio (0.01 to 50 %, 0.02 to 60 %, else
        0.03; their code sets none above 70 %, where this keeps 0.03)."""
        if self.rmi_delta is not None:
            return float(self.rmi_delta)
        ratio = float(self.ratio or 0.0)
        return 0.01 if ratio <= 0.5 else 0.02 if ratio <= 0.6 else 0.03

    def _validate_layerwise(self) -> SparsityConfig:
        """``layerwise`` and OWL's λ and M (``ValueError`` naming the key)."""
        if self.layerwise not in LAYERWISE:
            raise ValueError(f"sparsity.layerwise={self.layerwise!r} must be one of {LAYERWISE}")
        if self.layerwise == "none":
            return self
        if self.kind != "unstructured":
            raise ValueError(f"sparsity.layerwise={self.layerwise} gives per-block ratios to unstructured sparsity "
                             f"only, not kind={self.kind}; set sparsity.layerwise=none or choose sparsity=unstructured")
        ratio, lam = float(self.ratio), float(self.owl_lambda)
        if self.layerwise == "rmi":
            delta = self.rmi_spread
            if not 0.0 <= delta < min(ratio, 1.0 - ratio):
                raise ValueError(f"sparsity.rmi_delta={delta:g} must be >= 0 and below min(ratio, 1 - ratio)="
                                 f"{min(ratio, 1.0 - ratio):g}, so every block's ratio stays in (0, 1); lower it")
            return self
        if not 0.0 <= lam or not 2 * lam < min(ratio, 1.0 - ratio):
            raise ValueError(f"sparsity.owl_lambda={lam} must be >= 0 and 2λ below min(ratio, 1 - ratio)="
                             f"{min(ratio, 1.0 - ratio):g}, so every block's ratio stays in (0, 1); lower it")
        if not float(self.owl_m) > 0:
            raise ValueError(f"sparsity.owl_m={self.owl_m} must be > 0 (the paper's 5)")
        return self

    @property
    def target_ratio(self) -> float:
        """Fraction of zeros this pattern produces (0 for dense, 1 - n/m for N:M)."""
        if self.kind == "dense":
            return 0.0
        if self.kind == "nm":
            return 1.0 - int(self.n) / int(self.m)
        return float(self.ratio)

    @property
    def nm_pair(self) -> tuple[int | None, int | None]:
        """``(n, m)`` of an N:M pattern, else ``(None, None)``: the arguments of the N:M audit."""
        return (int(self.n), int(self.m)) if self.kind == "nm" else (None, None)

    @property
    def is_dense(self) -> bool:
        """True when nothing is pruned."""
        return self.kind == "dense"


CACHE_KEY = "cache_key"
"""Field metadata of a pruner config: whether the field enters the pruning cache key (default ``True``): ``False``,
or a predicate of the config (``lambda cfg: cfg.initial_method == "sparsegpt"``); a field left out must say why
under :data:`KEY_REASON`. ``register_pruner`` checks it; ``tests/test_cache_keys.py`` proves it."""
KEY_REASON = "reason"
"""Field metadata: why a field is (sometimes) left out of the cache key."""
UNORDERED = "unordered"
"""Field metadata: the field is a set written as a list (``targets``); the key holds it sorted."""


@dataclass
class PrunerConfig(Validated):
    """How to choose the zeros (``conf/pruner/*.yaml``): what every pruner shares. Each pruner extends it with its
    own fields (``spp/pruning/pruners/<name>/``, registered as the Hydra schema ``pruner/<name>_schema``).

    Attributes:
        name: The pruner (``none``, ``magnitude``, ``wanda``, ``sparsegpt``, ``dsnot`` or a plug-in's); choose it
            with ``pruner=<name>``.
        targets: Leaf names of the linear layers inside each decoder block that are pruned (embeddings and
            ``lm_head`` are never pruned).
        true_sequential: Calibrate the sublayer groups {q,k,v} -> {o} -> {gate,up} -> {down} one after another
            inside each block (SparseGPT's ``--true-sequential``); off = all sublayers see the dense block's inputs.
    """

    name: str = "none"
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS), metadata={UNORDERED: True})
    true_sequential: bool = False

    def validate(self) -> PrunerConfig:
        """Raise ``ValueError`` naming the config key when a setting is invalid; return ``self``."""
        own = type(self).__dataclass_fields__["name"].default
        if type(self) is not PrunerConfig and self.name != own:
            raise ValueError(f"pruner.name={self.name!r} in the config of pruner={own}; choose the pruner with "
                             f"pruner={self.name}, not pruner.name")
        if not self.targets:
            raise ValueError("pruner.targets is empty; list the linear layer names to prune (e.g. [q_proj, ...])")
        return self


@dataclass
class CalibrationConfig(Validated):
    """Calibration data for activation-aware pruners (``conf/calibration/*.yaml``).

    Attributes:
        source: ``c4``, ``wikitext2``, ``alpaca`` or a path to a local ``.txt``/``.json``/``.jsonl`` file.
        path: Data file to read instead of the source's default (relative to the data roots or absolute).
        nsamples: Number of calibration windows (reference default 128).
        seqlen: Tokens per window (reference default 2048); must not exceed the model's
            max_position_embeddings. Never taken from the model silently.
        seed: Seed of the window sampler (reference default 0; independent of the job's ``seed``).
        sampling: ``document`` (draw a random document longer than seqlen, then a random window inside it;
            Wanda/SparseGPT's C4 loader), ``stream`` (join all texts with blank lines, tokenize once, draw random
            windows) or null (document for c4, stream otherwise).
        text_field: JSON field holding the text; Alpaca records join instruction, input and output instead.
        batch_size: Windows per block forward pass (speed only; statistics do not depend on it).
    """

    source: str = "c4"
    path: str | None = None
    nsamples: int = 128
    seqlen: int = 2048
    seed: int = 0
    sampling: str | None = None
    text_field: str = "text"
    batch_size: int = 8

    def validate(self) -> CalibrationConfig:
        """Raise ``ValueError`` naming the config key when a setting is invalid; return ``self``."""
        if self.nsamples < 1:
            raise ValueError(f"calibration.nsamples={self.nsamples} must be >= 1")
        if self.seqlen < 2:
            raise ValueError(f"calibration.seqlen={self.seqlen} must be >= 2")
        if self.batch_size < 1:
            raise ValueError(f"calibration.batch_size={self.batch_size} must be >= 1")
        if self.sampling not in (None, "document", "stream"):
            raise ValueError(f"calibration.sampling={self.sampling!r} must be document, stream or null")
        return self


@dataclass
class PrunedModelGroups:
    """The config groups that say which model is pruned and how, shared by ``train.py``, ``prune.py`` and ``eval.py``
    (first in a job's bases, so they follow the shared keys in every job's field order).

    Attributes:
        model: The model to load (``eval.py``: a merged export is ``model.path=<run_dir>/merged``).
        pruner: How to prune (``none`` = the weights as loaded).
        sparsity: Which pattern (``dense`` = no pruning).
        calibration: Calibration data of the pruner (part of the cache key).
        reconstruct: Block-wise reconstruction against the dense model after pruning (``reconstruct=blockwise``;
            :class:`~spp.pruning.reconstruction.config.ReconstructConfig`, ``docs/reconstruction.md``): the base
            of an adapter a reconstructed run trained reuses its cache entry.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    sparsity: SparsityConfig = field(default_factory=SparsityConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    reconstruct: ReconstructConfig = field(default_factory=ReconstructConfig)


@dataclass
class PruneJobConfig(PrunedModelGroups, CacheLockJobConfig, FabricJobConfig):
    """Top-level config of ``prune.py`` (``conf/prune.yaml``): the pruned model and its records go to
    ``run_dir``; the shared keys are :class:`~spp.job_base.CacheLockJobConfig`'s and
    :class:`~spp.job_base.FabricJobConfig`'s, the groups :class:`PrunedModelGroups`'.

    Attributes:
        device: Where each block is processed (``cuda``, ``cpu``, ``cuda:1``); null = cuda when available.
        save_model: Write the pruned model with ``save_pretrained`` (and the tokenizer) to the run directory.
    """

    sparsity: SparsityConfig = field(default_factory=lambda: SparsityConfig(name="nm2_4", kind="nm", n=2, m=4))
    device: str | None = None
    save_model: bool = True


def register_prune_schema() -> None:
    """Register ``PruneJobConfig`` in Hydra's ConfigStore as ``prune_schema`` (the first default of prune.yaml)."""
    ConfigStore.instance().store(name="prune_schema", node=PruneJobConfig)
