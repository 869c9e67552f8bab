"""The Stanford Alpaca prompt template, as used by alpaca-lora and the SPP authors (``templates/alpaca.json``)."""

from __future__ import annotations

PROMPT_WITH_INPUT: str = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
"""Template for records with a non-empty ``input``."""

PROMPT_NO_INPUT: str = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
"""Template for records whose ``input`` is empty."""

RESPONSE_SPLIT: str = "### Response:"
"""Marker that separates the prompt from the generated response."""


def user_prompt(instruction: str, input: str = "") -> str:
    """The prompt up to and including ``### Response:\\n``; an empty ``input`` takes alpaca-lora's no-input template."""
    if input:
        return PROMPT_WITH_INPUT.format(instruction=instruction, input=input)
    return PROMPT_NO_INPUT.format(instruction=instruction)


def full_prompt(instruction: str, input: str, output: str) -> str:
    """Return the training text: the user prompt followed directly by the response ``output``."""
    return user_prompt(instruction, input) + output
