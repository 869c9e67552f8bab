"""The keys the job configs share, each with its default, doc and check once; every ``__post_init__`` calls
``super().__post_init__()``, so every check runs once whatever the mix."""

from __future__ import annotations

from dataclasses import dataclass

from spp.paths import CACHE_DIR_CONFIG

DEFAULT_LOCK_TIMEOUT_S = 7200.0
"""How long a job waits for another job writing the same cache entry before it gives up (``cache_lock_timeout_s``)."""


class Validated:
    """A config dataclass checked when it is built: ``__post_init__`` runs its ``validate()`` (a ``ValueError`` or
    :class:`~spp.errors.UserError` naming the key)."""

    def __post_init__(self) -> None:
        self.validate()  # type: ignore[attr-defined]


@dataclass
class JobConfig:
    """The keys every command shares.

    Attributes:
        data_dir: Data root (else ``$SPP_DATA_DIR`` or ``../shared/data`` when it exists, then the repo's ``data/``).
        seed: Global seed of the adapter's random init, dropout and sampled generation (the data split and
            shuffling follow ``data.seed``, the tiny model's weights ``model.seed``, calibration ``calibration.seed``).
        cache_dir: Root of the pruning and perplexity caches (a sweep over adapter settings prunes once;
            default ``$SPP_CACHE_DIR``, else ``~/.cache/spp``).
        run_dir: The folder the job's files go to (every command; its ``<script>.log`` and ``.hydra/`` too on a
            single run); null = Hydra's run directory (``outputs/<command>/...``; a sweep job's own folder).
    """

    data_dir: str | None = None
    seed: int = 0
    cache_dir: str = CACHE_DIR_CONFIG
    run_dir: str | None = None

    def __post_init__(self) -> None:
        """The end of the ``super().__post_init__()`` chain: the shared keys take any value."""


@dataclass
class CacheLockJobConfig(JobConfig):
    """A job that writes pruning cache entries and waits for another job writing the same one.

    Attributes:
        cache_lock_timeout_s: Seconds to wait for another job that is writing the same pruning cache entry
            (then one line and exit 2).
    """

    cache_lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.cache_lock_timeout_s > 0:
            raise ValueError(f"cache_lock_timeout_s={self.cache_lock_timeout_s} must be > 0 (seconds)")


@dataclass
class FabricJobConfig(JobConfig):
    """A job whose processes Lightning Fabric launches, pruning through the cache.

    Attributes:
        use_cache: Read / write the pruning cache; false always prunes and writes nothing there.
        accelerator: ``auto``, ``cpu`` or ``gpu``: where the processes run (a ``device`` key wins when set).
        devices: Processes per node (Lightning Fabric starts them, or takes those ``torchrun``/``srun`` started).
        num_nodes: Nodes.
    """

    use_cache: bool = True
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.devices < 1 or self.num_nodes < 1:
            raise ValueError(f"devices={self.devices} and num_nodes={self.num_nodes} must be >= 1")
        if self.accelerator not in ("auto", "cpu", "gpu"):
            raise ValueError(f"accelerator={self.accelerator!r} must be auto, cpu or gpu")
