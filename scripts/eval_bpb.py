"""Bits per byte of a checkpoint on the held-out split, next to gzip -9 and xz -9e on the same bytes.

    python scripts/eval_bpb.py --ckpt_path runs/stdlib_cpu_long/checkpoints/last.ckpt
    python scripts/eval_bpb.py --ckpt_path runs/demo/checkpoints/last.ckpt --max_windows 256

The model sees non-overlapping windows of its context length (each byte predicted once, context
restarting at every window); the compressors see the same bytes as one stream. Document separators
are predicted by the model but are not bytes, so they count in neither.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from distlab.checkpoint import load_gpt  # noqa: E402
from distlab.data.corpus import load_corpus  # noqa: E402
from distlab.data.windows import ValWindows  # noqa: E402
from distlab.modules.metrics import LanguageModelMetrics  # noqa: E402


def covered_bytes(ds: ValWindows) -> bytes:
    """The bytes whose predictions the windows score (targets only; separators dropped)."""
    parts = []
    for ai, off in ds.items:
        targets = np.asarray(ds.arrays[ai][off + 1 : off + ds.length])
        parts.append(targets[targets < 256].astype(np.uint8).tobytes())
    return b"".join(parts)


@torch.no_grad()
def model_bpb(ckpt_path: str, ds: ValWindows, batch_size: int = 16) -> float:
    model = load_gpt(ckpt_path)
    metric = LanguageModelMetrics()
    for start in range(0, len(ds), batch_size):
        xs, ys = zip(*(ds[i] for i in range(start, min(start + batch_size, len(ds)))), strict=True)
        x, y = torch.stack(xs), torch.stack(ys)
        logits = model(x)
        nats = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none"
        )
        metric.update(nats, y)
    return float(metric.compute()["bpb"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--max_windows", type=int, default=None, help="default: the whole held-out split")
    parser.add_argument("--val_fraction", type=float, default=0.02)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    seq_len = load_gpt(args.ckpt_path).config.sequence_len
    ds = ValWindows(load_corpus(None, args.val_fraction).val, seq_len, args.max_windows)
    data = covered_bytes(ds)
    t0 = time.perf_counter()
    result = {
        "windows": len(ds),
        "bytes": len(data),
        "model_bpb": model_bpb(args.ckpt_path, ds),
        "gzip9_bpb": 8 * len(gzip.compress(data, compresslevel=9)) / len(data),
        "xz9e_bpb": 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data),
    }
    result["seconds"] = time.perf_counter() - t0
    print(
        f"{result['windows']} windows, {result['bytes']:,} held-out bytes: model {result['model_bpb']:.3f} "
        f"bits/byte | gzip -9 {result['gzip9_bpb']:.3f} | xz -9e {result['xz9e_bpb']:.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
