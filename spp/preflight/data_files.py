"""The data files a job reads, checked before any weight is loaded: the training records (``data.source``) and the
perplexity files (the calibration file: :func:`spp.pruning.calibration_data.check_calibration_source`)."""

from __future__ import annotations

from spp.data.config import HUB_PREFIX
from spp.data.records import load_alpaca_records
from spp.errors import UserError
from spp.eval.perplexity import source_file


def check_data_source(source: str, data_dir: str | None, key: str = "data.source") -> int:
    """Read and validate the Alpaca records of ``data.source`` (hub sources are left to load time).

    Returns:
        The number of valid records (0 for a hub source).
    """
    if source.startswith(HUB_PREFIX):
        return 0
    try:
        records = load_alpaca_records(source, data_dir)
    except FileNotFoundError as err:
        raise UserError(f"{key}={source!r}: {str(err).split('; searched')[0]}",
                        f"pass data_dir=<dir holding {source}> or an absolute {key}=", key=key) from err
    except (ValueError, OSError) as err:
        raise UserError(f"{key}={source!r}: {err}", f"fix the file or point {key}= at a good copy", key=key,
                        path=source) from err
    return len(records.records)


def check_ppl_sources(sources: list[str], data_dir: str | None) -> None:
    """The perplexity data files exist."""
    for source in sources:
        try:
            source_file(source, data_dir)
        except FileNotFoundError as err:
            raise UserError(f"eval.ppl_source={source!r}: {str(err).split('; searched')[0]}",
                            "pass data_dir=<dir holding it> or eval=none", key="eval.ppl_source") from err
