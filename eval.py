"""Evaluate a model: ``python eval.py model.path=<dir>`` or ``python eval.py pruner=wanda sparsity=nm2_4``.

Composes ``conf/evaluate.yaml`` (typed by :class:`spp.eval.job_config.EvalJobConfig`): WikiText-2 perplexity,
the paper's seven zero-shot tasks and 5-shot MMLU through lm-eval on the local data, on (a) a saved model
directory or (b) a model pruned through the pruning cache, optionally with an SPP adapter loaded on top.
Writes ``results.json`` and a Table-2-shaped ``results.md`` to the run directory and logs to the loggers.
Every bad input (unknown task, missing data file, model directory without weights, ``eval.seqlen`` longer than
the model's context) stops with one ``eval.py: error: ...`` line before the model is loaded. The command is
``spp/commands/eval.py`` (the entry point: ``spp/commands/entry.py``).
"""

from spp.commands.entry import hydra_entry
from spp.commands.eval import COMMAND

main = hydra_entry(COMMAND)

if __name__ == "__main__":
    main()
