"""``distlab generate``, ``distlab export`` and ``distlab prepare``: commands that are plain functions, whose
signatures declare their options and domains (:func:`function_command_parser` builds each parser from them), e.g.
``distlab export --ckpt_path runs/demo/checkpoints/last.ckpt --out demo.safetensors``.
"""

from __future__ import annotations

import argparse
import codecs
import inspect
import os
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser

from distlab.checkpoint import export_safetensors, load_gpt
from distlab.data.shards import prepare
from distlab.data.tokenizer import ByteTokenizer
from distlab.domains import (
    ExistingPath,
    NonNegative,
    PositiveInt,
    SafetensorsFile,
    SampleLength,
    Seed,
    Text,
    _is_union,
    check_domains,
    describe,
)
from distlab.errors import ConfigError, DistlabError
from distlab.launch import several_processes_launched


def generate(
    ckpt_path: ExistingPath,
    prompt: Text = "def ",
    max_new_tokens: SampleLength = 200,
    temperature: NonNegative = 0.8,
    top_k: PositiveInt | None = 50,
    seed: Seed = 0,
) -> str:
    """Sample text from a trained checkpoint.

    Args:
        ckpt_path: a .ckpt written by distlab fit, or a distlab export .safetensors
        prompt: text to continue
        max_new_tokens: bytes to generate (for more, call GPT.generate from Python)
        temperature: 0 = greedy
        top_k: sample from the k most likely bytes (null: from all)
        seed: sampling seed
    """
    check_domains(generate, locals(), python=False)  # a command's options: a config's words
    model = load_gpt(ckpt_path)
    tok = ByteTokenizer()
    if model.config.vocab_size != tok.vocab_size:
        raise ConfigError(
            f"the GPT in {str(ckpt_path)!r} has vocab_size={model.config.vocab_size}, and distlab generate speaks bytes "
            f"(vocab_size={tok.vocab_size}): it was trained on another tokenizer's ids; sample from Python with "
            "distlab.checkpoint.load_gpt(path).generate(ids, ...) and decode with that tokenizer"
        )
    idx = torch.tensor([tok.encode(prompt, bos=True)], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    try:  # every check before the first byte is written: a refusal leaves no half-written result
        model.check_sampling(
            idx, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, generator=gen
        )
    except ConfigError as e:  # in the command's words: --top_k, not GPT.generate's argument
        said = str(e).replace("GPT.generate: ", "").replace("top_k=", "--top_k ", 1)
        raise ConfigError(
            said.replace("set top_k to", "set --top_k to").replace(", or None to", ", or null to")
        ) from None
    # Printed as it is sampled: the same tokens as one call (each step depends on the context and the generator).
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    if hasattr(sys.stdout, "reconfigure"):  # a terminal that is not UTF-8: replace what it cannot show
        sys.stdout.reconfigure(errors="replace")
    pieces = [decoder.decode(bytes(i for i in idx[0].tolist() if 0 <= i < 256))]
    try:
        write_result(pieces[0])
        for done in range(0, max_new_tokens, 64):
            n = min(64, max_new_tokens - done)
            idx = model.generate(idx, n, temperature=temperature, top_k=top_k, generator=gen)
            new = bytes(i for i in idx[0, -n:].tolist() if 0 <= i < 256)
            pieces.append(decoder.decode(new))
            write_result(pieces[-1])
        pieces.append(decoder.decode(b"", final=True))
        write_result(pieces[-1] + "\n")
    except BrokenPipeError:  # `distlab generate ... | head`: the reader has what it wanted; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
    return "".join(pieces)


def write_result(text: str) -> None:
    """Write (and flush) a command's result to standard output; a write that fails there (a full disk) is said as
    that, a closed pipe (``| head``) is left to the caller."""
    if sys.stdout is None:  # started with standard output closed (`>&-`): Python has no stream to write to
        raise DistlabError(
            "standard output is closed, so the result has nowhere to go; redirect it instead (> result.txt)"
        )
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush fails no more
        raise DistlabError(
            f"could not write the result to standard output ({e.strerror or e}): where it is redirected takes no "
            "more; free space there, or redirect it to another file"
        ) from e


def export(ckpt_path: ExistingPath, out: SafetensorsFile, overwrite: bool = False) -> Path:
    """Write a checkpoint's model weights and hyperparameters as safetensors (no pickle).

    Args:
        ckpt_path: a .ckpt file or an FSDP2 checkpoint folder
        out: output file, e.g. model.safetensors (written whole or not at all)
        overwrite: replace an existing --out
    """
    check_domains(export, locals(), python=False)  # a command's options: a config's words
    written = export_safetensors(ckpt_path, out, overwrite=overwrite)
    write_result(f"wrote {written}\n")
    return written


# ``distlab <name>`` commands that are plain functions: their signatures declare their options and domains.
FUNCTION_COMMANDS: dict[str, Callable[..., Any]] = {fn.__name__: fn for fn in (generate, export, prepare)}


def function_command_parser(name: str) -> Any:
    """The parser of ``distlab generate`` / ``export`` / ``prepare``, built from the function's signature.

    jsonargparse reads every annotation; a list option is also given as shell words (``--paths a b``, as argparse
    users type it) and a flag as ``--overwrite`` alone (or ``--overwrite true``)."""
    fn = FUNCTION_COMMANDS[name]
    description = (fn.__doc__ or "").split("\n")[0]
    parser = ArgumentParser(prog=f"distlab {name}", description=description, exit_on_error=False)
    hints = typing.get_type_hints(fn)  # and each option's help, its line in the docstring's Args: section
    helps = dict(re.findall(r"^\s{8}(\w+): (.+)$", fn.__doc__ or "", flags=re.MULTILINE))
    shell_style = {}
    for pname, param in inspect.signature(fn).parameters.items():
        tp = hints[pname]
        members = [m for m in typing.get_args(tp) if m is not type(None)] if _is_union(tp) else [tp]
        if tp is bool:
            shell_style[pname] = {"type": bool, "nargs": "?", "const": True}
        elif len(members) == 1 and typing.get_origin(members[0]) is list:
            # items as words; the function's own check_domains refuses a bad one by name ('nope' does not exist)
            # (no type=: jsonargparse before 4.40 refuses type and action together; the words are strings anyway)
            shell_style[pname] = {"nargs": "*", "action": _WordsAction}
        else:
            continue
        shell_style[pname].update(default=param.default, help=f"{helps.get(pname, '')} ({describe(tp)})")
    parser.add_function_arguments(fn, as_group=False, skip=set(shell_style))
    for pname, kwargs in shell_style.items():
        parser.add_argument(f"--{pname}", **kwargs)
    return parser


class _WordsAction(argparse.Action):
    """A list option given as shell words: the first ``--paths a b`` replaces the default, a repeated one adds to
    it (argparse's store would silently keep only the last)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        given = before is not None and before != self.default  # (still the default: this is the first)
        setattr(namespace, self.dest, [*(before if given else []), *values])


def run_function_command(name: str, argv: list[str]) -> Any:
    """Parse ``argv`` against the command's signature (refusing what lies outside a declared domain), then run it,
    in one process (several started by torchrun / srun would each do the same work and write the same files)."""
    launched = several_processes_launched()
    if launched:
        raise ConfigError(
            f"distlab {name} runs in one process, and {launched}: each would do the same work and write the same "
            f"files; run distlab {name} without torchrun / srun"
        )
    cfg = function_command_parser(name).parse_args(argv)
    return FUNCTION_COMMANDS[name](**cfg.as_dict())
