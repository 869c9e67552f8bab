"""The preflight of ``reconstruct=blockwise`` (``train.py`` and ``prune.py``, before any weight is read): the form
trains and takes its options, the windows fit the model's positions, and the calibration file they come from exists
and can supply them. Each refusal is one :class:`~spp.errors.UserError` naming the ``reconstruct.*`` key."""

from __future__ import annotations

import re
from typing import Any

from spp.adapters.base import AdapterMethod
from spp.errors import UserError
from spp.preflight.shapes import check_shapes
from spp.pruning.calibration_data import check_calibration_source
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.engine import calibration_of, form_config

_CALIBRATION_KEY = re.compile(r"\bcalibration\.(source|path|nsamples|seqlen)\b")
"""The calibration keys a reconstruction has under its own name (``reconstruct.source`` ...)."""


def check_reconstruct(cfg: ReconstructConfig, arch: dict[str, Any], data_dir: str | None, model: Any,
                      method: AdapterMethod | None) -> None:
    """Refuse, before any weight is read, a reconstruction that would fail after pruning (``method``: the resolved
    form, a job's ``Methods.form``).

    Raises:
        UserError: ``reconstruct.form`` unknown or ``none``; ``reconstruct.form_options`` with a key the form lacks;
            ``reconstruct.seqlen`` beyond ``max_position_embeddings``; ``reconstruct.source`` / ``reconstruct.path``
            missing, unreadable or too short for ``reconstruct.nsamples`` windows of ``reconstruct.seqlen`` tokens.
    """
    if not cfg.enabled:
        return
    form = form_config(cfg, method)
    try:  # the form's own shape rules (SPP: r divides every out_features), as an adapter's
        check_shapes(arch, adapter=form, seqlens={"reconstruct.seqlen": cfg.seqlen}, method=method)
    except UserError as err:
        raise UserError(_form_key(err.what), _form_key(err.fix), key=_form_key(err.key or "")) from err
    calibration = calibration_of(cfg)
    try:
        check_calibration_source(calibration, data_dir, model)
    except UserError as err:
        key = "reconstruct.path" if cfg.path and err.key == "calibration.source" else _renamed(err.key or "")
        what = _renamed(err.what)
        if key == "reconstruct.path":  # the file named by the path, not the source, is missing
            what = f"reconstruct.path={cfg.path!r}: {what.removeprefix(f'reconstruct.source={cfg.source!r}: ')}"
        raise UserError(what, _renamed(err.fix).replace(", set calibration.sampling=stream or ", " or "), key=key,
                        path=err.path) from err


def _form_key(text: str) -> str:
    """``adapter.<key>`` → ``reconstruct.form_options.<key>`` in a shape rule's message."""
    return re.sub(r"\badapter\.(?=[a-z_])", "reconstruct.form_options.", text)


def _renamed(text: str) -> str:
    """``calibration.<key>`` → ``reconstruct.<key>`` in a calibration check's message."""
    return _CALIBRATION_KEY.sub(r"reconstruct.\1", text)
