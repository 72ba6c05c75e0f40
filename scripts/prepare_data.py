"""Tokenize text into uint16 .bin shards: ``python -m distlab.data.prepare`` (this file runs it from the repository).

python scripts/prepare_data.py --paths ~/code/myproject --out data_cache/myproject
"""

from distlab.data.prepare import main

if __name__ == "__main__":
    import sys

    sys.exit(main())
