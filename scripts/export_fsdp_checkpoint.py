"""Export a sharded FSDP2 checkpoint folder to one file that the plain GPT and load_gpt read.

    python scripts/export_fsdp_checkpoint.py runs/x/checkpoints/step=100.ckpt gpt.ckpt
    distlab generate --ckpt_path gpt.ckpt --prompt "def " --max_new_tokens 100

The folder is what `strategy: fsdp2` / `fsdp2_spawn` saves (torch.distributed.checkpoint shards +
meta.pt). Runs in one process, no GPU or process group needed; the optimizer state is not read.
Output: {"hyper_parameters": ..., "state_dict": {"model.<name>": tensor}}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow `python scripts/export_fsdp_checkpoint.py` from a checkout
    sys.path.insert(0, str(REPO))

from distlab.checkpoint import export_consolidated  # noqa: E402
from distlab.errors import ConfigError  # noqa: E402


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt_dir", help="sharded checkpoint folder (e.g. runs/x/checkpoints/step=100.ckpt)")
    parser.add_argument("out", help="output file (e.g. gpt.ckpt)")
    args = parser.parse_args(argv)
    try:
        out = export_consolidated(args.ckpt_dir, args.out)
    except ConfigError as e:  # a missing folder, a refused payload: one line, exit 2
        print(f"export: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
