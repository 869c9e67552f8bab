"""Generate from a model: ``python generate.py model.path=<run>/merged prompt="What is the capital of France?"``.

Composes ``conf/generate.yaml`` (typed by :class:`spp.generation.GenerateJobConfig`), loads the model the way
``train.py`` / ``eval.py`` do (:func:`spp.models.load_model`), wraps the prompt in the Alpaca template
(``template=none`` for raw text), decodes greedily (``do_sample=true temperature=… top_p=… seed=…`` to sample)
and prints the completion with tokens/s; ``generation.json`` goes to the run directory. ``sparse24=true`` runs
the 7 projections as PyTorch 2:4 semi-structured sparse tensors (CUDA sm80+, a model pruned 2:4); anything
else stops with one ``generate.py: error: ...`` line. The command is ``spp/commands/generate.py`` (the entry
point: ``spp/commands/entry.py``).
"""

from spp.commands.entry import hydra_entry
from spp.commands.generate import COMMAND

main = hydra_entry(COMMAND)

if __name__ == "__main__":
    main()
