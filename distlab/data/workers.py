"""distlab's iterable datasets are one stream per rank: a DataLoader's worker processes would each yield all of it.

torch gives every worker process of a ``DataLoader(num_workers=N)`` its own copy of an ``IterableDataset`` and
interleaves what they yield: a dataset that does not split its stream by worker (``get_worker_info()``) hands the
model every batch N times. One worker process yields the stream once, as the loader's own process would. :func:`refuse_loader_workers` is the check each of distlab's streams makes when it
starts to iterate.
"""

from __future__ import annotations

from torch.utils.data import get_worker_info

from distlab.errors import ConfigError


def refuse_loader_workers(dataset: object) -> None:
    """Raise a one-line ConfigError when ``dataset`` is being iterated by one of several DataLoader worker processes
    (each would yield the same stream). The main process (``num_workers=0``) and a single worker pass."""
    info = get_worker_info()
    if info is None or info.num_workers <= 1:
        return
    name = type(dataset).__name__
    raise ConfigError(
        f"{name} is iterated by a DataLoader with num_workers={info.num_workers}: each worker process would yield "
        f"the same batches ({name} does not split its stream by worker), so every batch would come "
        f"{info.num_workers} times; set num_workers=0 (or 1) in that DataLoader ({name} computes each batch from "
        "the step; one process serves it)"
    )
