"""Bad input, as users type it: one short line (what, the value seen, what to set), a non-zero exit, no
traceback, nothing written, an earlier run's checkpoint untouched, and no pickled code ever run.

Each row runs ``distlab.cli.main`` in this process (fast); ``test_errors.py`` checks the real console
script's exit status and stderr once. A new error joins by adding a row.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import socket
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from distlab.cli import main
from distlab.data.corpus import BIN_HEADER_INTS, BIN_MAGIC, write_bin_shard
from tests.helpers.cli import CONFIGS, REPO


class _Payload:
    """Unpickling this runs ``touch <marker>``: the proof that a load ran code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """The files the rows point at: broken configs, checkpoints and shards, and an earlier run's checkpoint."""
    d = tmp_path_factory.mktemp("bad_inputs")
    f = {name: d / name for name in ("bad.yaml", "nccl.yaml", "corrupt.ckpt", "payload.ckpt", "odd.bin")}
    f["bad.yaml"].write_text("trainer: [1, 2\n")
    f["nccl.yaml"].write_text(
        "trainer:\n  devices: 2\n  strategy:\n    class_path: distlab.strategies.OptimizerSyncDDPStrategy\n"
        "    init_args: {process_group_backend: nccl, start_method: spawn}\n"
    )
    f["corrupt.ckpt"].write_bytes(os.urandom(512))
    f["marker"] = d / "payload_ran"
    torch.save({"hyper_parameters": {"depth": _Payload(f["marker"])}, "state_dict": {}}, f["payload.ckpt"])
    f["other_class.ckpt"] = d / "other_class.ckpt"
    f["import_marker"] = d / "imported"
    torch.save(
        {
            "hyper_parameters": {"_class_path": "tests.helpers.import_marker.Marker"},
            "state_dict": {},
            "pytorch-lightning_version": "2.6.0",
            "global_step": 2,
            "loops": {},
        },
        f["other_class.ckpt"],
    )
    run = d / "gpt_run"  # the same checkpoint in a run folder: the refusal names that run's config.yaml
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  class_path: tests.helpers.import_marker.Marker\n")
    f["other_class_in_run.ckpt"] = run / "checkpoints" / "last.ckpt"
    f["other_class_in_run.ckpt"].write_bytes(f["other_class.ckpt"].read_bytes())
    f["odd.bin"].write_bytes(b"\x01\x02\x03")
    f["utf32.txt"] = d / "utf32.txt"
    f["utf32.txt"].write_text("def f(x):\n    return x\n" * 50, encoding="utf-32")
    f["empty_shard"] = d / "empty_shard"
    f["empty_shard"].mkdir()
    write_bin_shard(f["empty_shard"] / "train_000.bin", np.arange(3000, dtype=np.uint16) % 257)
    write_bin_shard(f["empty_shard"] / "val_000.bin", np.arange(2000, dtype=np.uint16) % 257)
    (f["empty_shard"] / "train_001.bin").write_bytes(b"")
    f["gzipped.ckpt"] = d / "gzipped.ckpt.gz"
    import gzip

    f["gzipped.ckpt"].write_bytes(gzip.compress(b"PK\x03\x04 a torch checkpoint"))
    for name, path in {
        "cb_module.yaml": "distlab.callbacks",
        "cb_called.yaml": "distlab.callbacks.RankZeroValidation()",
        "cb_pl.yaml": "pytorch_lightning.callbacks.ModelCheckpoint",
        "cb_function.yaml": "distlab.preflight.check_parsed",
    }.items():
        f[name] = d / name
        f[name].write_text(f"trainer:\n  callbacks:\n    - class_path: {path}\n")
    f["hparams.yaml"] = d / "hparams.yaml"  # a run's flat hyperparameters, as Lightning saves them
    f["hparams.yaml"].write_text(
        "_instantiator: lightning.pytorch.cli.instantiate_module\ndepth: 2\noptimizer: muon\n"
    )
    f["flat_model.yaml"] = d / "flat_model.yaml"
    f["flat_model.yaml"].write_text("depth: 2\n")
    f["optimizer.yaml"] = d / "optimizer.yaml"
    f["optimizer.yaml"].write_text("optimizer:\n  class_path: torch.optim.AdamW\n  init_args: {lr: 0.001}\n")
    f["settings_build_another.ckpt"] = d / "settings_build_another.ckpt"  # hparams edited, weights not
    torch.save(
        {
            "hyper_parameters": {"_class_path": "distlab.modules.GPTLightningModule", "depth": 2},
            "state_dict": {"model.wte.weight": torch.zeros(4, 4)},
            "pytorch-lightning_version": "2.6.0",
            "global_step": 2,
        },
        f["settings_build_another.ckpt"],
    )
    f["my_model.py"] = d / "my_model.py"
    f["my_model.py"].write_text("import lightning as L\n\n\nclass MyModel(L.LightningModule):\n    pass\n")
    f["loop.ckpt"] = d / "loop.ckpt"
    f["loop.ckpt"].symlink_to("loop.ckpt")
    f["empty.txt"] = d / "empty.txt"
    f["empty.txt"].write_text("")
    f["fifo"] = d / "fifo.ckpt"
    os.mkfifo(f["fifo"])
    f["classifier.ckpt"] = d / "classifier.ckpt"  # what distlab fit saves for the digits CNN, in miniature
    torch.save(
        {
            "hyper_parameters": {
                "_class_path": "distlab.modules.ImageClassifier",
                "n_classes": 10,
                "width": 32,
            },
            "state_dict": {"net.0.weight": torch.zeros(2, 2)},
            "global_step": 1,
        },
        f["classifier.ckpt"],
    )
    f["tiny.txt"] = d / "tiny.txt"  # 60 tokens: no room for two windows of 33
    f["tiny.txt"].write_text("x" * 59)
    f["val_only"] = d / "val_only"
    f["val_only"].mkdir()
    write_bin_shard(f["val_only"] / "val_000.bin", np.arange(1000, dtype=np.uint16) % 257)
    f["version7"] = d / "version7"
    f["version7"].mkdir()
    for split in ("train", "val"):
        seven = np.zeros(BIN_HEADER_INTS, dtype=np.int32)
        seven[:3] = [BIN_MAGIC, 7, 500]
        (f["version7"] / f"{split}_000.bin").write_bytes(
            seven.tobytes() + np.ones(500, dtype=np.uint16).tobytes()
        )
    for name in (
        "good_shards",
        "damaged_magic",
        "extra_bytes",
        "joined",
    ):  # a shard folder each, val shard intact
        f[name] = d / name
        f[name].mkdir()
        write_bin_shard(f[name] / "val_000.bin", np.arange(2000, dtype=np.uint16) % 257)
        write_bin_shard(f[name] / "train_000.bin", np.arange(3000, dtype=np.uint16) % 257)
    raw = bytearray((f["damaged_magic"] / "train_000.bin").read_bytes())
    raw[:4] = b"\0\0\0\0"  # the magic overwritten: read raw, the 1 KB header would be 512 tokens
    (f["damaged_magic"] / "train_000.bin").write_bytes(bytes(raw))
    with open(f["extra_bytes"] / "train_000.bin", "ab") as extra:
        extra.write(b"\1" * 20)
    with open(
        f["joined"] / "train_000.bin", "ab"
    ) as joined:  # `cat train_000.bin train_001.bin > train_all.bin`
        joined.write((f["joined"] / "val_000.bin").read_bytes())
    header = np.zeros(BIN_HEADER_INTS, dtype=np.int32)
    header[:3] = [BIN_MAGIC, 1, 1000]  # says 1000 tokens, holds 10
    f["truncated.bin"] = d / "truncated.bin"
    f["truncated.bin"].write_bytes(header.tobytes() + np.zeros(10, dtype=np.uint16).tobytes())
    f["a_file"] = d / "a_file"
    f["a_file"].write_text("x")
    dcp = d / "step=2.ckpt"  # a sharded-checkpoint folder whose .metadata pickle would run code
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(pickle.dumps(_Payload(f["marker"])))
    f["dcp_payload"] = dcp
    for name, text in {
        "model_null.yaml": "model:\n",
        "steps_under_data.yaml": "data:\n  max_steps: 8\n",
        "no_class_path.yaml": "trainer:\n  callbacks:\n    - init_args: {every_n_train_steps: 1}\n",
        "escape.yaml": "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {filename: '../../escape_{step}'}\n",
        "zero_interval.yaml": "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {train_time_interval: '00:00:00:10'}\n",
        "tab.yaml": "trainer:\n\tmax_steps: 3\n",
        "init_typo.yaml": "model:\n  class_path: distlab.modules.GPTLightningModule\n  init_args:\n    depht: 2\n",
        "nested_unknown.yaml": "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {every_n_train_steps: 2, foo: {bar: 1}}\n",
        "top.yaml": "max_steps: 3\n",
        "init_arg.yaml": "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_arg:\n        every_n_train_steps: 2\n",
        "min_delta.yaml": "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "      init_args: {monitor: val_loss, min_delta: -0.1}\n",
        "named_callbacks.yaml": "trainer:\n  callbacks:\n    ckpt:\n      class_path: lightning.pytorch.callbacks.ModelCheckpoint\n",
        "hparams.yaml": "_instantiator: lightning.pytorch.cli.instantiate_module\ndepth: 1\n",
        "keyed_by_fit.yaml": "fit:\n  trainer:\n    max_steps: 2\n",
        "flat_class_path.yaml": "model:\n  class_path: distlab.modules.GPTLightningModule\n  depth: 2\n",
        "flat_callback.yaml": "trainer:\n  callbacks:\n  - class_path: ModelCheckpoint\n    init_args:\n    every_n_train_steps: 1\n",
        "init_list.yaml": "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: [1, 2]\n",
        "init_number.yaml": "model:\n  class_path: distlab.modules.GPTLightningModule\n  init_args: 5\n",
        "init_null.yaml": "model:\n  class_path: distlab.modules.GPTLightningModule\n  init_args: null\n",
        "two_documents.yaml": "trainer:\n  max_steps: 4\n---\nmodel:\n  init_args:\n    depth: 1\n",
        "octal.yaml": "trainer:\n  max_steps: 010\n",
        "base60.yaml": "trainer:\n  max_time: 1:30\n",
        "tilde.yaml": "trainer:\n  default_root_dir: ~\n",
        "off.yaml": "model:\n  init_args:\n    schedule: off\n",
        "ckpt_in_trainer.yaml": "trainer:\n  ckpt_path: last\n",
    }.items():
        f[name] = d / name
        f[name].write_text(text)
    f["empty_dir"] = d / "empty_dir"
    f["empty_dir"].mkdir()
    f["dup.yaml"] = d / "dup.yaml"
    f["dup.yaml"].write_text("trainer:\n  max_steps: 3\n  max_steps: 4\n")
    f["empty.yaml"] = d / "empty.yaml"
    f["empty.yaml"].write_text("# nothing but a comment\n")
    # A real sharded checkpoint (torch.distributed.checkpoint, one process), then cut short two ways.
    import torch.distributed.checkpoint as dcp_api

    for name in ("no_shard.ckpt", "no_meta.ckpt", "short_shard.ckpt"):
        folder = d / name
        dcp_api.save({"state_dict": {"w": torch.ones(64)}}, checkpoint_id=str(folder))
        torch.save({"global_step": 2, "loops": {}, "hyper_parameters": {}}, folder / "meta.pt")
        f[name] = folder
    for shard in f["no_shard.ckpt"].glob("*.distcp"):
        shard.unlink()
    (f["no_meta.ckpt"] / "meta.pt").unlink()
    for shard in f["short_shard.ckpt"].glob("*.distcp"):  # an interrupted copy: the first half of the bytes
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    from distlab.models.gpt import GPT, GPTConfig

    other_vocab = dict(depth=1, aspect_ratio=32, head_dim=16, sequence_len=16, vocab_size=300)
    weights = {f"model.{k}": v for k, v in GPT(GPTConfig(**other_vocab)).state_dict().items()}
    f["vocab300.ckpt"] = d / "vocab300.ckpt"
    torch.save({"hyper_parameters": other_vocab, "state_dict": weights}, f["vocab300.ckpt"])
    byte_vocab = {**other_vocab, "vocab_size": 257, "sequence_len": 32}  # weights of a run that diverged
    nan_weights = {f"model.{k}": v for k, v in GPT(GPTConfig(**byte_vocab)).state_dict().items()}
    nan_weights["model.lm_head.weight"][0, 0] = float("nan")
    f["nan.ckpt"] = d / "nan.ckpt"
    lightning_keys = {"pytorch-lightning_version": "2.6.0", "global_step": 2, "loops": {}}
    torch.save({"hyper_parameters": byte_vocab, "state_dict": nan_weights, **lightning_keys}, f["nan.ckpt"])
    f["dangling_run"] = d / "dangling_run"
    f["dangling_run"].symlink_to(d / "moved_away")
    f["muon.ckpt"] = d / "muon.ckpt"
    finite = {k: torch.nan_to_num(v) for k, v in nan_weights.items()}
    torch.save(
        {
            "hyper_parameters": {**byte_vocab, "optimizer": "muon"},
            "state_dict": finite,
            "optimizer_states": [],
            **lightning_keys,
        },
        f["muon.ckpt"],
    )
    f["weights_only.ckpt"] = d / "weights_only.ckpt"  # as ModelCheckpoint(save_weights_only=True) writes it
    torch.save(
        {"hyper_parameters": byte_vocab, "state_dict": finite, **lightning_keys}, f["weights_only.ckpt"]
    )
    f["renamed.safetensors"] = d / "renamed.safetensors"  # a torch checkpoint under an export's name
    f["renamed.safetensors"].write_bytes(f["muon.ckpt"].read_bytes())
    from safetensors.torch import save_file

    f["exported.safetensors"] = d / "exported.safetensors"
    save_file(
        {"model.w": torch.zeros(2)},
        str(f["exported.safetensors"]),
        metadata={"distlab_hyper_parameters": "{}"},
    )
    corpus = d / "corpus_with_broken_link"
    corpus.mkdir()
    (corpus / "a.py").write_text("x = 1\n" * 50)
    (corpus / "b.py").symlink_to(d / "gone.py")
    f["broken_link_corpus"] = corpus
    mixed = d / "text_and_a_bin"  # a text folder with one stray .bin
    mixed.mkdir()
    (mixed / "a.py").write_text("x = 1\n" * 50)
    (mixed / "firmware.bin").write_bytes(b"\x00\x01" * 8)
    f["text_and_a_bin"] = mixed
    f["utf16.txt"] = d / "utf16.txt"
    f["utf16.txt"].write_bytes("x = 1\n".encode("utf-16"))
    f["empty.ckpt"] = d / "empty.ckpt"
    f["empty.ckpt"].write_bytes(b"")
    f["lfs.ckpt"] = d / "lfs.ckpt"
    f["lfs.ckpt"].write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    f["page.ckpt"] = d / "page.ckpt"
    f["page.ckpt"].write_text("<!DOCTYPE html><html><body>Sign in</body></html>")
    f["stop_folder"] = d / "stop_folder"
    f["stop_folder"].mkdir()
    f["cut.ckpt"] = d / "cut.ckpt"  # a real torch checkpoint whose copy stopped half-way
    buffer = io.BytesIO()
    torch.save({"state_dict": {"w": torch.zeros(4096)}, "global_step": 3}, buffer)
    f["cut.ckpt"].write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (d / "loop_a").symlink_to(d / "loop_b")  # two links that lead to each other
    (d / "loop_b").symlink_to(d / "loop_a")
    f["link_loop"] = d / "loop_a"
    f["anchor_loop.yaml"] = d / "anchor_loop.yaml"
    f["anchor_loop.yaml"].write_text("trainer: &t\n  max_steps: 3\n  plugins: [*t]\n")
    earlier = d / "earlier_run" / "checkpoints"  # an earlier run's checkpoint a new fit must not touch
    earlier.mkdir(parents=True)
    (earlier / "last.ckpt").write_bytes(b"an earlier run's checkpoint")
    f["earlier_run"] = earlier.parent
    return f


def _rows(f: dict[str, Path], run: str) -> list[tuple[str, list[str], str]]:
    debug = ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={run}"]
    fsdp2 = ["--config", str(CONFIGS / "trainer" / "fsdp2_cpu.yaml")]
    sync2 = ["--config", str(CONFIGS / "trainer" / "ddp_optimizer_sync_spawn_cpu.yaml")]
    return [
        # ---- config files and keys (jsonargparse): one line that points to --help
        ("missing config file", ["fit", "--config", "/nonexistent.yaml"], "File does not exist: '/nonexistent.yaml'"),
        ("YAML syntax error", ["fit", "--config", str(f["bad.yaml"])], "is not valid YAML: expected ',' or ']', but got '<stream end>' (line 2, column 1)"),
        ("unknown key", [*debug, "--trainer.max_stepz=3"], "trainer.max_stepz=3 is not a Trainer argument (did you mean 'max_steps'?)"),
        ("wrong type", [*debug, "--trainer.max_steps=abc"], "trainer.max_steps=abc is not accepted; set trainer.max_steps to an integer >= 1"),
        ("unknown subcommand", ["fitt"], "unknown subcommand 'fitt' (did you mean 'fit'?)"),
        ("model class missing", [*debug, "--model", "my_pkg.Missing"], "no module named 'my_pkg'"),
        ("model file is a run's hparams.yaml", [*debug, "--model", str(f["hparams.yaml"])], "is a run's hparams.yaml (the model's settings, flat"),
        ("model file is a whole config", [*debug, "--model", str(f["optimizer.yaml"]).replace("optimizer", "nccl")], "is a whole config (it has trainer): give it to --config"),
        ("model file holds no class_path", [*debug, "--model", str(f["flat_model.yaml"])], "holds no class_path; write the file as class_path:"),
        ("model file missing", [*debug, "--model", str(f["flat_model.yaml"]) + ".missing.yaml"], "names a file that does not exist"),
        ("model short name unknown", [*debug, "--model", "GPTLightningModul"], "model class 'GPTLightningModul' is not a LightningModule imported here; did you mean 'GPTLightningModule'?"),
        ("data short name unknown", [*debug, "--data", "TextData"], "data class 'TextData' is not a LightningDataModule imported here"),
        ("invalid precision", [*debug, "--trainer.precision=bf17"], "trainer.precision"),
        ("misspelt option under init_args", [*debug, "--config", str(f["init_typo.yaml"])], "model.depht is not an option of distlab.modules.GPTLightningModule (did you mean 'depth'?); `distlab"),
        ("unknown nested option under init_args", [*debug, "--config", str(f["nested_unknown.yaml"])], "trainer.callbacks.foo is not an option of lightning.pytorch.callbacks.ModelCheckpoint;"),
        ("odd head_dim", [*debug, "--model.head_dim=15"], "must be even for rotary embeddings; set model.head_dim to an even number (e.g. 16)"),
        ("precision named as a dtype", [*debug, "--trainer.precision=fp8"], "trainer.precision=fp8 is not accepted; set trainer.precision to one of 64, 32, 16"),
        ("accelerator this machine lacks", [*debug, "--trainer.accelerator=tpu"], "trainer.accelerator=tpu is not accepted (not available here"),
        ("accelerator name unknown", [*debug, "--trainer.accelerator=npu0"], "trainer.accelerator=npu0 is not accepted (no accelerator has that name); set trainer.accelerator to one of auto"),
        ("strategy name misspelt", [*debug, "--trainer.strategy=ddp_optimiser_sync"], "trainer.strategy=ddp_optimiser_sync is not accepted (no strategy has that name (did you mean 'ddp_optimizer_sync'?))"),
        ("a learning rate far out", [*debug, "--model.head_lr=1e30"], "model.head_lr=1e30 is not accepted; set model.head_lr to a learning rate in (0, 10]"),
        ("a count written as a fraction", [*debug, "--trainer.overfit_batches=2.0"], "(a whole number written as a fraction: write 2 for a count)"),
        ("logger name leaving its folder", [*debug, "--trainer.logger=TensorBoardLogger", f"--trainer.logger.save_dir={run}", "--trainer.logger.name=../../escape"], "name=../../escape is not accepted (it leaves its folder"),
        ("the same stateful callback twice", [*debug, "--trainer.max_steps=1", "--trainer.callbacks=[distlab.callbacks.RankZeroValidation, distlab.callbacks.RankZeroValidation]"], "trainer.callbacks lists RankZeroValidation twice"),
        ("profiler name unknown", [*debug, "--trainer.profiler=fast"], "trainer.profiler=fast is not accepted (no profiler has that name); set trainer.profiler to one of advanced, pytorch, simple"),
        # ---- values distlab checks
        ("max_steps not set", [*debug, "--trainer.max_steps=-1"], "trainer.max_steps must be a positive integer"),
        ("heads do not divide width", [*debug, "--model.n_embd=100", "--model.n_head=3"], "n_embd=100 is not divisible by n_head=3"),
        ("window longer than context", [*debug, "--data.seq_len=64"], "data.seq_len=64 exceeds the model context"),
        ("learning rate zero", [*debug, "--model.embedding_lr=0"], "model.embedding_lr=0 is not accepted; set model.embedding_lr to a learning rate in (0, 10]"),
        ("batch size zero", [*debug, "--data.batch_size=0"], "data.batch_size=0 is not accepted; set data.batch_size to an integer >= 1"),
        ("local value clipping", [*debug, *sync2, "--trainer.gradient_clip_val=1.0", "--trainer.gradient_clip_algorithm=value"], "would clamp each rank's local, unsynced gradients"),
        # ---- data
        ("data path missing", [*debug, "--data.paths=[/nonexistent/corpus]"], "data.paths=['/nonexistent/corpus'] is not accepted (does not exist)"),
        ("shard not whole tokens", [*debug, f"--data.paths=[{f['odd.bin']}]"], "3 bytes is not a whole number of uint16 tokens"),
        ("shard truncated", [*debug, f"--data.paths=[{f['truncated.bin']}]"], "is truncated: its header says 1,000 tokens"),
        ("duplicate YAML key", ["fit", "--config", str(f["dup.yaml"])], "keep one (YAML keeps the last one silently)"),
        ("empty config file", ["fit", "--config", str(f["empty.yaml"])], "is empty (or only comments)"),
        ("flag before the config that sets it", ["fit", "--trainer.max_steps=3", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={run}"], "comes before --config"),
        ("unexpanded variable in a path", [*debug, "--data.paths=[${HOME}/corpus]"], "unexpanded environment variable"),
        ("YAML indented with a tab", ["fit", "--config", str(f["tab.yaml"])], "a tab character (line 2, column 1): YAML indents with spaces only"),
        ("Trainer setting at the top level", ["fit", "--config", str(f["top.yaml"])], "sets max_steps at the top level, where only sections go"),
        ("config file without --config", ["fit", str(CONFIGS / "debug.yaml")], "is given without --config before it"),
        ("--config before the subcommand", ["--config", str(CONFIGS / "debug.yaml"), "fit"], "--config comes before the subcommand 'fit'"),
        ("init_arg instead of init_args", [*debug, "--config", str(f["init_arg.yaml"])], "not 'init_arg' (did you mean 'init_args'?)"),
        ("float16 weights on the CPU", [*debug, "--trainer.precision=16-true"], "trainer.precision='16-true' keeps the weights in float16"),
        ("checkpoint file name template unclosed", [*debug, "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.filename={step"], "filename={step is not accepted (it is not a file-name template"),
        ("negative min_delta of EarlyStopping", [*debug, "--config", str(f["min_delta.yaml"])], "(EarlyStopping).min_delta=-0.1 is not accepted"),
        ("seed that is not a number", [*debug, "--seed_everything=abc"], "seed_everything=abc is not accepted; set seed_everything to true or false, or an integer"),
        ("run folder at the filesystem root", [*debug, "--trainer.default_root_dir=/"], "trainer.default_root_dir=/ is not accepted (it is the filesystem root"),
        ("run folder as a URL", [*debug, "--trainer.default_root_dir=s3://bucket/runs/x"], "trainer.default_root_dir=s3://bucket/runs/x is not accepted (it is a URL; distlab reads and writes local paths"),
        ("run folder ending in a space", [*debug, "--trainer.default_root_dir=runs/x "], "is not accepted (it begins or ends with whitespace"),
        ("fsdp2 cpu_offload on CPU ranks", [*debug, "--trainer.strategy=distlab.strategies.FSDP2Strategy", "--trainer.strategy.cpu_offload=true", "--trainer.devices=2"], "fsdp2 cpu_offload=true keeps GPU ranks' shards in CPU memory"),
        ("strategy class misspelt", [*debug, "--trainer.strategy=distlab.strategies.FSDP2Strategyy"], "module distlab.strategies has no FSDP2Strategyy; did you mean distlab.strategies.FSDP2Strategy?"),
        ("stop file that exists already", [*debug, "--trainer.callbacks+=distlab.callbacks.CheckpointOnStopRequest", f"--trainer.callbacks.stop_file={f['a_file']}"], "exists before the run started"),
        ("stop file that is a folder", [*debug, "--trainer.callbacks+=distlab.callbacks.CheckpointOnStopRequest", f"--trainer.callbacks.stop_file={f['empty_dir']}"], "is a folder; it names the file whose creation asks the run to stop"),
        ("peak FLOP/s given in TFLOP/s", [*debug, "--trainer.callbacks+=distlab.callbacks.SpeedMonitor", "--trainer.callbacks.peak_flops=312"], "set trainer.callbacks.peak_flops to FLOP/s, >= 1e9 (e.g. 312e12, not 312)"),
        ("min_epochs on an endless stream", [*debug, "--trainer.min_epochs=1"], "trainer.min_epochs=1: the text data is an endless stream"),
        ("a notebook as the config", ["fit", "--config", str(REPO / "notebooks" / "your_own_model.ipynb")], "has none of distlab's sections (trainer, model, data)"),
        ("a batch limit exact validation would not apply", ["fit", "--config", str(CONFIGS / "digits_cpu.yaml"), f"--trainer.default_root_dir={run}", "--trainer.limit_val_batches=1"], "trainer.limit_val_batches=1: RankZeroValidation evaluates the whole set exactly"),
        ("every device on a CPU", [*debug, "--trainer.devices=-1"], "trainer.devices=-1 means every device, which is for GPUs; on the CPU set trainer.devices to a number of processes, or auto"),
        ("device indices on a CPU", [*debug, "--trainer.devices=[0,1]"], "trainer.devices=[0, 1] lists device indices, which is for GPUs; on the CPU set trainer.devices to a number of processes (2 for [0, 1])"),
        ("device indices as text on a CPU", [*debug, "--trainer.devices=0,1"], "trainer.devices=[0, 1] lists device indices, which is for GPUs; on the CPU set trainer.devices to a number of processes (2 for [0, 1])"),
        ("a device index twice, as text", [*debug, "--trainer.devices=0,0"], "trainer.devices=0,0 lists device 0 more than once: two ranks would share one device"),
        ("a device index twice", [*debug, "--trainer.devices=[1,0,1]"], "trainer.devices=[1, 0, 1] lists device 1 more than once"),
        ("seed numpy cannot take", [*debug, "--seed_everything=-5"], "seed_everything=-5 is not accepted; set seed_everything to true or false, or an integer in [0, 2**32)"),
        ("empty data folder", [*debug, f"--data.paths=[{f['empty_dir']}]"], "is a folder with no files in it"),
        ("run folder name too long", ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={'x' * 300}"], "the system refuses the name (File name too long)"),
        ("validate without a checkpoint", ["validate", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={run}"], "would run GPTLightningModule's freshly initialised (untrained) weights"),
        ("a run folder as the checkpoint", [*debug, f"--ckpt_path={f['earlier_run']}"], "is a folder of checkpoints, not a checkpoint; pass one of them"),
        ("config section left empty", [*debug, "--config", str(f["model_null.yaml"])], "sets model: to nothing (null)"),
        ("callback without class_path", [*debug, "--config", str(f["no_class_path.yaml"])], "trainer.callbacks item 1 has no class_path"),
        ("checkpoint file name outside its folder", [*debug, "--config", str(f["escape.yaml"])], "(ModelCheckpoint).filename=../../escape_{step} is not accepted"),
        ("checkpoint interval of zero", [*debug, "--config", str(f["zero_interval.yaml"])], "(ModelCheckpoint).train_time_interval=0:00:00 is not accepted"),
        ("head_dim that the width does not hold", [*debug, "--model.n_embd=64", "--model.head_dim=48"], "model.n_embd=64 is not a multiple of model.head_dim=48"),
        ("zero epochs", [*debug, "--trainer.max_epochs=0"], "trainer.max_epochs=0 is not accepted"),
        ("binary file as text data", [*debug, f"--data.paths=[{f['payload.ckpt']}]"], "holds binary data (a NUL byte at offset"),
        ("broken symlink in the data folder", [*debug, f"--data.paths=[{f['broken_link_corpus']}]"], "is a symbolic link to nothing"),
        ("training turned off", [*debug, "--trainer.limit_train_batches=0"], "trainer.limit_train_batches=0 turns training off, so the fit trained nothing"),
        ("a batch larger than the training set", ["fit", "--config", str(CONFIGS / "digits_cpu.yaml"), "--trainer.max_steps=2", "--data.batch_size=5000", f"--trainer.default_root_dir={run}"], "fewer than one batch of data.batch_size=5000"),
        ("a loss plot without a CSV log", [*debug, "--trainer.logger=false", "--trainer.callbacks+=distlab.callbacks.LossCurvePlot"], "LossCurvePlot draws the CSV log, but no CSVLogger is configured"),
        ("a Windows path", ["fit", "--config", str(CONFIGS / "debug.yaml"), "--trainer.default_root_dir=C:\\runs\\exp1"], "it is a Windows path (a drive letter or backslashes)"),
        ("a run folder that is a broken link", ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={f['dangling_run']}"], "is a symbolic link to nothing"),
        ("a logger's option before any logger", [*debug, "--trainer.logger.save_dir=logs"], "trainer.logger.save_dir is set before any trainer.logger class is chosen"),
        ("a YAML mapping without its space", [*debug, "--trainer.callbacks+=GradientAccumulationScheduler", "--trainer.callbacks.scheduling={0:2}"], "YAML needs a space after each ':' in a mapping"),
        ("a callback's settings not under init_args", [*debug, "--config", str(f["flat_callback.yaml"])], "trainer.callbacks item 1: sets every_n_train_steps beside class_path"),
        ("a checkpoint dirpath holding another run", [*debug, "--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={f['earlier_run']}/checkpoints"], "the ModelCheckpoint's dirpath"),
        ("resume a weights-only checkpoint", [*debug, "--trainer.max_steps=3", f"--ckpt_path={f['weights_only.ckpt']}"], "holds the model's weights only"),
        ("resume under another optimizer", [*debug, "--trainer.max_steps=3", "--model.optimizer=adamw", f"--ckpt_path={f['muon.ckpt']}"], "was trained with model.optimizer='muon', and this fit sets model.optimizer='adamw'"),
        ("resume from NaN weights", [*debug, "--trainer.max_steps=3", f"--ckpt_path={f['nan.ckpt']}"], "holds NaN/Inf weights (model.lm_head.weight)"),
        ("callbacks as a mapping of names", [*debug, "--config", str(f["named_callbacks.yaml"])], "trainer.callbacks is a mapping of names (ckpt); write it as a list"),
        ("a run's hparams.yaml as --config", [*debug, "--config", str(f["hparams.yaml"])], "is a run's hparams.yaml"),
        ("model and data classes swapped", [*debug, "--model", "distlab.data.TextDataModule"], "it is a LightningDataModule, not a LightningModule; give it as --data"),
        ("options on a strategy a preset names", [*debug, "--config", str(CONFIGS / "trainer" / "ddp_spawn_cpu.yaml"), "--trainer.strategy.timeout=1:00:00"], "trainer.strategy is the name 'ddp_spawn'"),
        ("a logger class misspelt", [*debug, "--trainer.logger=CSVLoger"], "no Logger class named 'CSVLoger' can be imported (did you mean 'CSVLogger'?)"),
        ("a plugin that is no class", [*debug, "--trainer.plugins=foo"], "trainer.plugins=foo is not accepted"),
        ("a text folder with a stray .bin", [*debug, f"--data.paths=[{f['text_and_a_bin']}]"], "so it would be read as token shards and its 1 text files ignored"),
        ("UTF-16 text data", [*debug, f"--data.paths=[{f['utf16.txt']}]"], "is UTF-16 text"),
        ("the whole file system as data", [*debug, "--data.paths=[/]"], "the whole file system"),
        ("a config keyed by subcommand after it", [*debug, "--config", str(f["keyed_by_fit.yaml"])], "is keyed by subcommand ('fit:')"),
        ("settings beside class_path", [*debug, "--config", str(f["flat_class_path.yaml"])], "model: sets depth beside class_path"),
        ("min_epochs beyond max_epochs", [*debug, "--trainer.max_epochs=1", "--trainer.min_epochs=5"], "trainer.min_epochs=5 is beyond trainer.max_epochs=1"),
        ("an empty --ckpt_path", [*debug, "--ckpt_path="], "--ckpt_path is empty"),
        ("an empty checkpoint file", ["validate", "--config", str(CONFIGS / "debug.yaml"), f"--ckpt_path={f['empty.ckpt']}"], "is not a checkpoint: it is empty"),
        ("a Git LFS pointer as checkpoint", [*debug, f"--ckpt_path={f['lfs.ckpt']}"], "it is a Git LFS pointer"),
        ("a web page as checkpoint", ["generate", "--ckpt_path", str(f["page.ckpt"])], "it is a web page"),
        ("a class's required argument left unset", [*debug, "--trainer.callbacks+=EarlyStopping"], "lightning.pytorch.callbacks.EarlyStopping needs monitor (its __init__ gives no default"),
        ("a function as the model class", [*debug, "--model", "distlab.checkpoint.load_gpt"], "it is a function, not a class"),
        # ---- launch
        ("unknown strategy", [*debug, "--trainer.strategy=ddpp"], "trainer.strategy=ddpp is not accepted (no strategy has that name (did you mean 'ddp'?))"),
        ("no GPU here", [*debug, "--trainer.accelerator=gpu"], "trainer.accelerator=gpu, but this machine has no CUDA GPU that torch can use"),
        ("nccl without CUDA", [*debug, "--config", str(f["nccl.yaml"])], "process_group_backend='nccl' needs CUDA GPUs"),
        ("zero devices", [*debug, "--trainer.devices=0"], "trainer.devices='0' is not accepted on the cpu accelerator; set trainer.devices to a number of processes >= 1"),
        ("run folder under a file", ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={f['a_file']}/run"], "is a file, so nothing can be created under it"),
        ("fresh fit into an earlier run", ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={f['earlier_run']}"], "already holds an earlier run (checkpoints/last.ckpt)"),
        # ---- checkpoints from strangers
        ("a data setting under model", [*debug, "--model.batch_size=8"], "model.batch_size is not an option of distlab.modules.GPTLightningModule: batch_size is a data setting; move it under data"),
        ("a trainer setting under data in a config", [*debug, "--config", str(f["steps_under_data.yaml"])], "max_steps is a trainer setting; move it under trainer"),
        ("one file too short for two windows", [*debug, f"--data.paths=[{f['tiny.txt']}]"], "data.paths gives one file of 60 tokens, too short for a training and a validation window of seq_len+1=33 tokens each; set data.seq_len to at most 29"),
        ("only validation shards", [*debug, f"--data.paths=[{f['val_only']}]"], "all in validation shards"),
        ("a shard of another format version", [*debug, f"--data.paths=[{f['version7']}]"], "of format version 7, and distlab reads version 1"),
        ("head_dim that n_embd and n_head contradict", [*debug, "--model.n_embd=32", "--model.n_head=4", "--model.head_dim=16"], "model.head_dim=16 has no effect: model.n_embd=32 and model.n_head=4 make heads of 8"),
        ("'.bin' among the text extensions", [*debug, "--data.extensions=[.py,.bin]"], "(not .bin: .bin files are read as token shards)"),
        ("head_dim that a derived width and n_head contradict", [*debug, "--model.n_head=2", "--model.head_dim=8"], "model.head_dim=8 has no effect: model.n_embd=32 (depth x aspect_ratio, rounded up to head_dim) and model.n_head=2 make heads of 16"),
        ("transformer engine on the cpu", [*debug, "--trainer.precision=transformer-engine"], "is NVIDIA Transformer Engine's FP8"),
        ("a timeout beyond a year", [*debug, "--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy", "--trainer.strategy.timeout=999999999 days, 0:00:00"], "set timeout to a positive duration up to 365 days"),
        ("max_time as H:MM:SS", [*debug, "--trainer.max_time=0:00:30"], "set trainer.max_time to a duration 'DD:HH:MM:SS' > 0, or a mapping such as {'hours': 1}, or null, or a datetime.timedelta in Python"),
        ("generate from a classifier's checkpoint", ["generate", "--ckpt_path", str(f["classifier.ckpt"])], "not by distlab's GPT language model; distlab generate samples text from GPT checkpoints only"),
        ("digits: a validation share that leaves less than a batch", ["fit", "--config", str(CONFIGS / "digits_cpu.yaml"), f"--trainer.default_root_dir={run}", "--data.val_fraction=0.999"], "(data.val_fraction=0.999), 2 on each of 1 rank(s): fewer than one batch of data.batch_size=32 (a partial batch is dropped, so the fit would train nothing); set data.val_fraction to at most 0.98"),
        ("a callback's init_args as a list", [*debug, "--config", str(f["init_list.yaml"])], "the init_args of ModelCheckpoint must be a mapping of its options"),
        ("the model's init_args as a number", [*debug, "--config", str(f["init_number.yaml"])], "model.init_args is a number: the init_args of GPTLightningModule must be a mapping"),
        ("a config file of two YAML documents", [*debug, "--config", str(f["two_documents.yaml"])], "holds more than one document (a second '---' at line 3)"),
        ("one path where a list is declared", [*debug, f"--data.paths={f['tiny.txt']}"], f"a list is expected, and this is one item: write [{f['tiny.txt']}]"),
        ("prepare: shards of ten tokens", ["prepare", "--out", run, "--shard_tokens", "10"], "set shard_tokens to an integer >= 65536 (tokens)"),
        ("a shard whose magic is damaged", [*debug, f"--data.paths=[{f['damaged_magic']}]"], "has a damaged header"),
        ("a shard longer than its header says", [*debug, f"--data.paths=[{f['extra_bytes']}]"], "holds 20 bytes more than its header's 3,000 tokens"),
        ("two shards joined with cat", [*debug, f"--data.paths=[{f['joined']}]"], "another shard's header inside it at byte 7,024: shards joined with cat?"),
        ("a named pipe as the checkpoint", [*debug, f"--ckpt_path={f['fifo']}"], "is a named pipe, not a checkpoint file"),
        ("/dev/null as the checkpoint", ["export", "--ckpt_path", "/dev/null", "--out", f"{run}.safetensors"], "'/dev/null' is a character device, not a checkpoint file"),
        ("one shard of a sharded checkpoint", ["generate", "--ckpt_path", str(f["no_meta.ckpt"] / "__0_0.distcp")], "is one piece of the sharded checkpoint folder"),
        ("extensions without paths", [*debug, "--data.extensions=[.rst]"], "data.extensions=[.rst] picks files from the folders in data.paths, and data.paths is unset"),
        ("val_fraction for token shards", [*debug, f"--data.paths=[{f['good_shards']}]", "--data.val_fraction=0.5"], "has no effect on token shards"),
        ("extensions for token shards", [*debug, f"--data.paths=[{f['good_shards']}]", "--data.extensions=[.csv]"], "data.extensions=[.csv] has no effect on token shards: every .bin file a folder in data.paths holds is read as a shard"),
        ("extensions: null for token shards", [*debug, f"--data.paths=[{f['good_shards']}]", "--data.extensions=null"], "data.extensions: null has no effect on token shards"),
        ("an empty data file", [*debug, f"--data.paths=[{f['empty.txt']}]"], "is empty (0 bytes): no text to train on"),
        ("a backend this torch lacks", [*debug, "--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy", "--trainer.devices=2", "--trainer.strategy.start_method=spawn", "--trainer.strategy.process_group_backend=mpi"], "process_group_backend='mpi' is not built into this torch"),
        ("init_args: null", [*debug, "--config", str(f["init_null.yaml"])], "model.init_args is empty (null): remove the init_args line"),
        ("a callback option before any callback", [*debug, "--trainer.callbacks.every_n_steps=2"], "is set before any trainer.callbacks class is chosen (Callback is only their base); choose one first (--trainer.callbacks+="),
        ("an option typed without its value", [*debug, "--model.depth"], "--model.depth is given without a value; write --model.depth=VALUE"),
        ("a weight decay that zeroes the weights", [*debug, "--model.weight_decay=1e6"], "multiplies the weights by 1 - lr x weight_decay"),
        ("validation at a quarter of an endless epoch", [*debug, "--trainer.val_check_interval=0.25", "--trainer.check_val_every_n_epoch=1"], "trainer.val_check_interval=0.25 is a share of an epoch, and the training data is an endless stream"),
        ("export: only a suffix as the name", ["export", "--ckpt_path", str(f["corrupt.ckpt"]), "--out", f"{run}/.safetensors"], "it has no file name before .safetensors"),
        ("export: a trailing space in the name", ["export", "--ckpt_path", str(f["corrupt.ckpt"]), "--out", f"{run}.safetensors "], "begins or ends with whitespace"),
        ("a callback that needs what the module lacks", [*debug, "--trainer.callbacks+=BackboneFinetuning", "--trainer.max_steps=2"], "the callback BackboneFinetuning needs the module to have `backbone`, and GPTLightningModule has none"),
        ("a UTF-32 data file", [*debug, f"--data.paths=[{f['utf32.txt']}]"], "is UTF-32 text (it starts with a UTF-32 byte-order mark); save it as UTF-8"),
        ("an empty shard among good ones", [*debug, f"--data.paths=[{f['empty_shard']}]"], "train_001.bin' is empty (0 bytes"),
        ("a gzipped checkpoint", ["generate", "--ckpt_path", str(f["gzipped.ckpt"])], "it is gzip-compressed; decompress it first"),
        ("a newline in the run folder", ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={run}\nx"], "it holds a newline or another control character"),
        ("prepare: one file twice", ["prepare", "--out", run, "--paths", str(f["tiny.txt"]), str(f["tiny.txt"])], "twice: its text would be read twice"),
        ("max_steps 0", [*debug, "--trainer.max_steps=0"], "set trainer.max_steps to an integer >= 1 (-1, no limit, suits validate and test only: a fit needs an end)"),
        ("validation every second epoch of an endless stream", [*debug, "--trainer.check_val_every_n_epoch=2"], "trainer.check_val_every_n_epoch=2 validates only after epoch 1 ends"),
        ("a model registry without litmodels", [*debug, "--trainer.model_registry=foo"], "which is not installed, so nothing would be uploaded"),
        ("generate given a trainer option", ["generate", "--ckpt_path", str(f["corrupt.ckpt"]), "--trainer.accelerator=gpu"], "--trainer.* options belong to distlab fit / validate / test, not to distlab generate"),
        ("an --optimizer option", [*debug, "--optimizer=torch.optim.SGD"], "distlab fit has no --optimizer"),
        ("an optimizer section in a config", [*debug, "--config", str(f["optimizer.yaml"])], "distlab fit has no --optimizer"),
        ("a callback class_path that is a module", [*debug, "--config", str(f["cb_module.yaml"])], "distlab.callbacks is a module, not a class"),
        ("a callback class_path called", [*debug, "--config", str(f["cb_called.yaml"])], "ends in '()': name the class without calling it"),
        ("a pytorch_lightning callback", [*debug, "--config", str(f["cb_pl.yaml"])], "write lightning.pytorch.callbacks.ModelCheckpoint"),
        ("a function as a callback", [*debug, "--config", str(f["cb_function.yaml"])], "is a function, not a class"),
        ("checkpoint missing", [*debug, "--ckpt_path=/nonexistent.ckpt"], "checkpoint not found: '/nonexistent.ckpt'"),
        ("checkpoint corrupt", [*debug, f"--ckpt_path={f['corrupt.ckpt']}"], "cannot read it"),
        ("far more CPU ranks than cores", [*debug, "--trainer.devices=4096"], "trainer.devices=4096 would start 4096 CPU processes on this machine"),
        ("checkpoint cut short", [*debug, f"--ckpt_path={f['cut.ckpt']}"], "is not a checkpoint: it is cut short"),
        ("run folder through a link loop", [*debug, f"--trainer.default_root_dir={f['link_loop']}/run"], "is a symbolic link that leads back to itself"),
        ("YAML anchor inside itself", [*debug, "--config", str(f["anchor_loop.yaml"])], "trainer.plugins.0 holds an alias of an anchor that encloses it"),
        ("checkpoint runs code (fit)", [*debug, f"--ckpt_path={f['payload.ckpt']}"], "GLOBAL posix.system"),
        ("checkpoint runs code (validate)", ["validate", "--config", str(CONFIGS / "debug.yaml"), f"--ckpt_path={f['payload.ckpt']}"], "GLOBAL posix.system"),
        ("checkpoint runs code (test)", ["test", "--config", str(CONFIGS / "debug.yaml"), f"--ckpt_path={f['payload.ckpt']}"], "GLOBAL posix.system"),
        ("checkpoint runs code (generate)", ["generate", "--ckpt_path", str(f["payload.ckpt"])], "GLOBAL posix.system"),
        ("sharded checkpoint runs code", [*debug, *fsdp2, f"--ckpt_path={f['dcp_payload']}"], "references posix.system"),
        ("checkpoint names another class", [*debug, f"--ckpt_path={f['other_class.ckpt']}"], "give the config of the run that wrote it"),
        ("another class's checkpoint in its run folder", ["validate", "--config", str(CONFIGS / "digits_cpu.yaml"), f"--ckpt_path={f['other_class_in_run.ckpt']}"], "--config " + str(f["other_class_in_run.ckpt"].parent.parent / "config.yaml")),
        ("validate without checkpoint file", ["validate", "--config", str(CONFIGS / "debug.yaml"), "--ckpt_path=/nonexistent.ckpt"], "checkpoint not found"),
        ("sharded checkpoint missing a shard", [*debug, f"--ckpt_path={f['no_shard.ckpt']}"], "is incomplete: its shard __0_0.distcp is missing"),
        ("sharded checkpoint with a shard cut short", [*debug, f"--ckpt_path={f['short_shard.ckpt']}"], "is incomplete: its shard __0_0.distcp has "),
        ("sharded checkpoint missing meta.pt", [*debug, f"--ckpt_path={f['no_meta.ckpt']}"], "is incomplete: no meta.pt"),
        # ---- generate
        ("generate: checkpoint missing", ["generate", "--ckpt_path", "/nonexistent.ckpt"], "ckpt_path=/nonexistent.ckpt is not accepted (does not exist)"),
        ("generate: a length that never ends", ["generate", "--ckpt_path", str(f["corrupt.ckpt"]), "--max_new_tokens=100000000"], "max_new_tokens=100000000 is not accepted; set max_new_tokens to an integer in [0, 1000000]"),
        ("generate: negative length", ["generate", "--ckpt_path", str(f["corrupt.ckpt"]), "--max_new_tokens=-1"], "max_new_tokens=-1 is not accepted; set max_new_tokens to an integer in [0, 1000000]"),
        ("generate: a model of another tokenizer", ["generate", "--ckpt_path", str(f["vocab300.ckpt"])], "has vocab_size=300, and distlab generate speaks bytes"),
        ("generate: checkpoint without its option name", ["generate", str(f["corrupt.ckpt"])], "is given without an option name; write --ckpt_path"),
        ("generate: a torch checkpoint named .safetensors", ["generate", "--ckpt_path", str(f["renamed.safetensors"])], "is a torch checkpoint (what torch.save writes) under a .safetensors name"),
        ("generate: NaN weights", ["generate", "--ckpt_path", str(f["nan.ckpt"])], "holds NaN/Inf weights (lm_head.weight)"),
        ("export: NaN weights", ["export", "--ckpt_path", str(f["nan.ckpt"]), "--out", f"{run}.safetensors"], "holds NaN/Inf weights (model.lm_head.weight)"),
        ("export: an export again", ["export", "--ckpt_path", str(f["exported.safetensors"]), "--out", f"{run}.safetensors"], "is already an exported .safetensors file"),
        ("generate: misspelt option", ["generate", "--promt", "x"], "--promt is not an option (did you mean 'prompt'?)"),
        # ---- export
        ("export: checkpoint runs code", ["export", "--ckpt_path", str(f["payload.ckpt"]), "--out", f"{run}.safetensors"], "GLOBAL posix.system"),
        ("export: not a safetensors name", ["export", "--ckpt_path", str(f["corrupt.ckpt"]), "--out", f"{run}.pt"], "does not end in .safetensors"),
        ("export: settings that build another model", ["export", "--ckpt_path", str(f["settings_build_another.ckpt"]), "--out", f"{run}.safetensors"], "its weights are not those of the model its saved settings build"),
        # ---- audit 31: YAML's own readings, callbacks' rules, user modules, files that are not what they seem
        ("a YAML octal", [*debug, "--config", str(f["octal.yaml"])], "'010' is read by YAML as octal (8)"),
        ("a YAML base-60 number", [*debug, "--config", str(f["base60.yaml"])], "'1:30' is read by YAML as a base-60 number"),
        ("a YAML 1.1 boolean word", [*debug, "--config", str(f["off.yaml"])], "'off' is read by YAML as false (YAML 1.2 reads it as text)"),
        ("two loggers named without their settings", [*debug, "--trainer.logger=[CSVLogger,CSVLogger]", f"--trainer.logger.save_dir={run}"], "add them one at a time, each followed by its own: --trainer.logger+=CSVLogger"),
        ("a YAML ~ for home", [*debug, "--config", str(f["tilde.yaml"])], "default_root_dir: ~ is YAML's null (no value), not your home folder"),
        ("a ~ for home on the command line", [*debug, "--trainer.logger=CSVLogger", "--trainer.logger.save_dir=~"], "--trainer.logger.save_dir: ~ is YAML's null"),
        ("ckpt_path under trainer", [*debug, "--config", str(f["ckpt_in_trainer.yaml"])], "ckpt_path is not a trainer setting but the subcommand's own"),
        ("an em dash for --", [*debug, "\u2014trainer.max_steps=2"], "(U+2014, a typographic dash pasted from a document), not '--'; retype it as --trainer.max_steps"),
        ("a logger version that leaves its folder", [*debug, "--trainer.logger=TensorBoardLogger", f"--trainer.logger.save_dir={run}", "--trainer.logger.version=../../../escaped"], "version=../../../escaped is not accepted (it leaves its folder"),
        ("GradientAccumulationScheduler with accumulate_grad_batches", [*debug, "--trainer.callbacks+=GradientAccumulationScheduler", "--trainer.callbacks.scheduling={0: 2}", "--trainer.accumulate_grad_batches=4"], "the callback GradientAccumulationScheduler refuses its settings"),
        ("SWA by its defaults on a step-bounded fit", [*debug, "--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs=0.01"], "swa_epoch_start is a share of max_epochs by default"),
        ("EarlyStopping at epoch ends of an endless stream", [*debug, "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss", "--trainer.callbacks.check_on_train_epoch_end=true"], "EarlyStopping(check_on_train_epoch_end=true) checks its metric at the end of each training epoch"),
        ("save_top_k without a monitor", [*debug, "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_top_k=3"], "ModelCheckpoint(save_top_k=3) keeps the best 3 checkpoints by a metric, and it has no monitor"),
        ("a stop file under a file", [*debug, "--trainer.callbacks+=distlab.callbacks.CheckpointOnStopRequest", f"--trainer.callbacks.stop_file={f['tiny.txt']}/STOP"], "tiny.txt' is a file, so nothing can be created under it"),
        ("a stop file where none can be created", [*debug, "--trainer.callbacks+=distlab.callbacks.CheckpointOnStopRequest", "--trainer.callbacks.stop_file=/proc/self/STOP"], "could never be created (cannot create files in '/proc/self'"),
        ("a /proc file as data", [*debug, "--data.paths=[/proc/self/status]"], "is a special file (the system gives its size as 0 bytes, yet it reads text"),
        ("prepare: a /proc file", ["prepare", "--out", run, "--paths", "/proc/self/status"], "is a special file"),
        ("a model module that exits when imported", [*debug, "--model=tests.helpers.exits_at_import.Model"], "ended the program (sys.exit(3)): its top-level code ran"),
        ("a '-' in a model module's name", [*debug, "--model=my-model.Model"], "'my-model' cannot be a module's name in an import path"),
        ("a class inside a class", [*debug, "--model=distlab.modules.GPTLightningModule.Inner"], "'distlab.modules.GPTLightningModule' is a class, not a module"),
        # ---- audit 32
        ("a data setting under trainer", [*debug, "--trainer.batch_size=8"], "batch_size is not a Trainer argument but a data setting; move it under data:"),
        ("prepared data as the run folder", [*debug, f"--trainer.default_root_dir={f['good_shards']}"], "holds prepared data (train_000.bin, written by distlab prepare)"),
        ("prepared data as a checkpoint folder", [*debug, "--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={f['good_shards']}"], "set the ModelCheckpoint's dirpath to a folder of its own"),
        ("a checkpoint as the config", ["fit", "--config", str(f["classifier.ckpt"])], "is a torch checkpoint (weights), not a YAML config; give it as --ckpt_path"),
        ("an export as the config", ["fit", "--config", str(f["exported.safetensors"])], "is an exported .safetensors file (weights), not a YAML config"),
        ("a long option with one dash", ["fit", "-config", str(CONFIGS / "debug.yaml")], "begins with one dash; long options take two: write --config"),
        ("a user's hook without Lightning's arguments", [*debug, "--trainer.callbacks+=tests.helpers.callbacks.WrongHookSignature"], "WrongHookSignature.on_train_batch_end ("),
        ("a Lightning 1.x training_step", [*debug, "--model=tests.helpers.modules.OptimizerIndexModule"], "RuntimeError: Training with multiple optimizers is only supported with manual optimization"),
        ("a learning-rate finder without an lr", [*debug, "--trainer.callbacks+=LearningRateFinder"], "the callback LearningRateFinder refuses its settings"),
        ("a base-class callback", [*debug, "--trainer.callbacks+=BaseFinetuning"], "the callback BaseFinetuning is a base class: its freeze_before_training is left to a subclass"),
        ("a CUDA-only profiler setting without CUDA", [*debug, "--trainer.profiler=PyTorchProfiler", "--trainer.profiler.emit_nvtx=true"], "emit_nvtx=True is not accepted; set trainer.profiler (PyTorchProfiler).emit_nvtx to true or false (true only where torch has CUDA"),
        # ---- audit 33
        ("a URL as the config", ["fit", "--config", "https://example.org/distlab/configs/debug.yaml"], "is a URL, and --config reads a local file"),
        ("a Python file as the config", ["fit", "--config", str(f["my_model.py"])], "is Python code, not a YAML config; name your class with --model="),
        ("a checkpoint link to itself", [*debug, f"--ckpt_path={f['loop.ckpt']}"], "is a symbolic link that leads back to itself"),
        # ---- audit 34
        ("an option written with hyphens", [*debug, "--trainer.max-steps=2"], "writes the option with '-'; options use '_': --trainer.max_steps=2"),
        ("an option joined to its value by a colon", [*debug, "--trainer.max_steps:2"], "joins the option and its value with ':'; write --trainer.max_steps=2"),
        ("early stopping thresholds that cross", [*debug, "--trainer.callbacks+=distlab.callbacks.SyncEarlyStopping", "--trainer.callbacks.monitor=val_loss", "--trainer.callbacks.stopping_threshold=5", "--trainer.callbacks.divergence_threshold=1"], "divergence_threshold=1.0 is on the wrong side of stopping_threshold=5.0"),
        ("export: sharded checkpoint runs code", ["export", "--ckpt_path", str(f["dcp_payload"]), "--out", f"{run}.safetensors"], "references posix.system"),
    ]  # fmt: skip


ROW_NAMES = [row[0] for row in _rows(defaultdict(lambda: Path("x")), "run")]
NEEDS_NO_CUDA = {"no GPU here", "nccl without CUDA", "a CUDA-only profiler setting without CUDA"}


def _snapshot(*folders: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha1(p.read_bytes()).hexdigest()
        for folder in folders
        if folder.exists()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_table_is_long_enough():
    assert len(ROW_NAMES) >= 25 and len(set(ROW_NAMES)) == len(ROW_NAMES)


@pytest.mark.parametrize("name", ROW_NAMES)
def test_bad_input_gets_one_line(name, inputs, tmp_path, capsys, monkeypatch):
    if name in NEEDS_NO_CUDA and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("DISTLAB_IMPORT_MARKER", str(inputs["import_marker"]))
    run = tmp_path / "run"
    row = {r[0]: r for r in _rows(inputs, str(run))}[name]
    _, args, expected = row
    before = _snapshot(inputs["earlier_run"], tmp_path)
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("distlab: error:")]
    assert info.value.code == 2, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert expected in lines[0], lines[0]
    assert len(lines[0]) < 400, f"not short: {len(lines[0])} characters"
    assert _snapshot(inputs["earlier_run"], tmp_path) == before, "something was written or changed"
    assert not run.exists(), "the run folder was created"
    assert not inputs["marker"].exists(), "a checkpoint's pickled code ran"
    assert not inputs["import_marker"].exists(), "a class named by a checkpoint was imported"


def test_a_busy_master_port_is_one_line(capsys, monkeypatch, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        args = ["fit", "--config", str(CONFIGS / "debug.yaml"), "--config"]
        args += [
            str(CONFIGS / "trainer" / "ddp_optimizer_sync_spawn_cpu.yaml"),
            f"--trainer.default_root_dir={tmp_path}",
        ]
        with pytest.raises(SystemExit) as info:
            main(args)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert info.value.code == 2 and f"MASTER_PORT={port} is already in use" in line


def test_export_under_a_launcher_and_a_stale_stop_file_are_refused(inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(
        "TORCHELASTIC_RUN_ID", "job"
    )  # torchrun's mark: WORLD_SIZE alone is a leftover, ignored
    with pytest.raises(SystemExit) as info:
        main(["export", "--ckpt_path", str(inputs["corrupt.ckpt"]), "--out", str(tmp_path / "m.safetensors")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        info.value.code == 2
        and "distlab export runs in one process, and torchrun started 2 processes" in line
    ), line
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    stale = tmp_path / "stop"
    stale.write_text("")
    monkeypatch.setenv("DISTLAB_STOP_FILE", str(stale))
    with pytest.raises(SystemExit) as info:
        main(
            ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}"]
        )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        info.value.code == 2 and "exists before the run started (left over from an earlier stop?)" in line
    ), line
    assert not (tmp_path / "run").exists()


def test_a_slip_in_the_error_translator_still_ends_in_one_line(tmp_path, monkeypatch, capsys):
    """The last line of defence holds even when the code that words an error fails itself: the user's error is
    reported in one line (exit 1, its traceback saved), never the translator's traceback on top of it."""
    import distlab.cli_errors as cli_errors
    from distlab.cli import main

    def broken(*args, **kwargs):
        raise ValueError("Unknown format code 'g' for object of type 'str'")

    monkeypatch.setattr(cli_errors, "one_line_error", broken)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["prepare", "--out", str(tmp_path / "o"), "--val_fraction", "10"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert info.value.code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "10" in lines[0] and "full traceback:" in lines[0], lines[0]
    assert not (tmp_path / "o").exists()


def test_a_debug_switch_that_is_neither_on_nor_off_is_refused(capsys, monkeypatch, tmp_path):
    """DISTLAB_DEBUG=off is off (it once turned the traceback on); a word that is neither is refused in one line."""
    monkeypatch.setenv("DISTLAB_DEBUG", "off")
    args = ["fit", "--config", str(CONFIGS / "debug.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--trainer.max_stepz=2"])
    assert info.value.code == 2 and "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("DISTLAB_DEBUG", "maybe")
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "DISTLAB_DEBUG='maybe' is neither on nor off" in err, err[-1000:]
    assert not (tmp_path / "run").exists()
