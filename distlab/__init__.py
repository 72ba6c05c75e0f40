"""distlab: a PyTorch Lightning toolkit for correct distributed training.

``import distlab`` registers the strategy names with Lightning (``ddp_optimizer_sync[_spawn]``,
``fsdp2[_spawn]``) and exposes the pieces a user takes à la carte::

    import distlab
    from distlab.optim import DistMuonAdamW, muon_param_groups
    from distlab.callbacks import RankZeroValidation, SyncEarlyStopping

    trainer = L.Trainer(strategy="ddp_optimizer_sync", callbacks=[RankZeroValidation(every_n_steps=50)])
"""

__version__ = "0.1.0"

from distlab.versions import (  # noqa: E402
    check_compromised,
    check_rank_variables,
    check_shadowed_modules,
    check_versions,
    check_working_folder,
    import_failures_in_one_line,
)

check_compromised()  # a release published as malware: refused before anything imports it
check_working_folder()  # a deleted working folder: torch's import would blame torch

check_versions()  # an untested Lightning/torch/... fails here, in one line, not deep inside an import below
check_rank_variables()  # RANK=abc: Lightning's import would fail on it in a traceback
check_shadowed_modules()  # a user's lightning.py on the path would be imported instead of Lightning

with import_failures_in_one_line():  # a broken install of a dependency (or of one of theirs): one line
    from distlab import callbacks, optim, strategies  # noqa: E402  (strategies: registers the names)
    from distlab.callbacks import NonFiniteLossError, RankZeroValidation, SampleText, SyncEarlyStopping  # noqa: E402
    from distlab.optim import DistAdamW, DistMuon, DistMuonAdamW, muon_param_groups, split_params  # noqa: E402
    from distlab.strategies import FSDP2Strategy, OptimizerSyncDDPStrategy  # noqa: E402

__all__ = [
    "DistAdamW",
    "DistMuon",
    "DistMuonAdamW",
    "FSDP2Strategy",
    "NonFiniteLossError",
    "OptimizerSyncDDPStrategy",
    "RankZeroValidation",
    "SampleText",
    "SyncEarlyStopping",
    "callbacks",
    "muon_param_groups",
    "optim",
    "split_params",
    "strategies",
]
