"""``python -m lab.reconstruction extend|chosen GRID_DIR [--prefix lr]``: the runner's queries (print
the point that extends a grid past its chosen endpoint, nothing when it is interior; or the chosen point, status 2
when the grid has none); ``pick ROOT --setting S --form F``: ``LR EPOCHS`` of the (setting, form)'s chosen
reconstruction (the report's choice: lowest validation perplexity over its rate and epochs grids);
``report ROOT [--out MD]``: the campaign's Markdown report; ``figure ROOT --out PNG``: its figure and the JSON of
what it plots (``<out>.json``). ``ROOT`` is the campaign directory (``experiments/results/runs/reconstruction``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.reconstruction.selection import chosen, extend
from spp.atomic import write_text_atomic


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.reconstruction", description=__doc__)
    p.add_argument("command", choices=["extend", "chosen", "pick", "report", "figure"])
    p.add_argument("path", type=Path, help="a grid directory (extend, chosen) or the campaign directory")
    p.add_argument("--prefix", default="lr")
    p.add_argument("--setting", default="nm2_4", help="pick: the setting (nm2_4, unstructured50, ...)")
    p.add_argument("--form", default="spp", help="pick: the reconstruction form")
    p.add_argument("--out", type=Path, help="the file to write (report: optional; figure: the PNG, required)")
    return p


def run(args: argparse.Namespace) -> str:
    """What the command prints."""
    if args.command == "extend":
        value = extend(args.path, args.prefix)
        return f"{value:g}" if value is not None else ""
    if args.command == "chosen":
        value = chosen(args.path, args.prefix)
        if value is None:  # the runner's `lr=$(... chosen ...) || return 1` then skips the step
            raise ValueError(f"no finished point with a validation perplexity under {args.path}: run its grid first")
        return f"{value:g}"
    if args.command == "pick":
        return pick(args.path, args.setting, args.form)
    if args.command == "report":
        from lab.reconstruction.report import report

        text = report(args.path)
        if args.out:
            write_text_atomic(args.out, text)
            return str(args.out)
        return text.rstrip("\n")
    if args.out is None:
        raise ValueError("figure needs --out PNG (for example --out experiments/results/figures/"
                         "reconstruction_smollm2_135m.png)")
    from lab.reconstruction.figure import draw

    return str(draw(args.path, args.out))


def pick(root: Path, setting: str, form: str) -> str:
    """``"<lr> <epochs>"`` of the chosen reconstruction of ``(setting, form)`` under the campaign ``root``."""
    from lab.reconstruction.grids import choices
    from lab.reconstruction.records import load

    found = [ch.chosen for ch in choices(load(root)) if (ch.setting, ch.form) == (setting, form)]
    if not found:
        raise ValueError(f"no finished grid point of {form} at {setting} under {root}: run its grid first")
    return f"{found[0].lr:g} {found[0].epochs}"


def main(argv: list[str] | None = None) -> int:
    """Print the answer of one command (nothing when there is none); a bad path is one line and status 2."""
    args = parser().parse_args(argv)
    try:
        out = run(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"reconstruction: {err}", file=sys.stderr)
        return 2
    if out:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
