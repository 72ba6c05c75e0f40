"""distlab's iterable datasets are one stream per rank: each worker process of a ``DataLoader(num_workers=N)``
would yield all of it (torch gives every worker its own copy of an ``IterableDataset``)."""

from __future__ import annotations

from torch.utils.data import get_worker_info

from distlab.errors import ConfigError


def refuse_loader_workers(dataset: object) -> None:
    """Refuse (ConfigError) to iterate ``dataset`` in one of several DataLoader worker processes."""
    info = get_worker_info()
    if info is None or info.num_workers <= 1:
        return
    name = type(dataset).__name__
    raise ConfigError(
        f"{name} is iterated by a DataLoader with num_workers={info.num_workers}: each worker process would yield "
        f"the same batches ({name} does not split its stream by worker), so every batch would come "
        f"{info.num_workers} times; set num_workers=0 (or 1) in that DataLoader"
    )
