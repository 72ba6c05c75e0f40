"""A user's DataModule whose training loader shuffles and is (or is not) torchdata's StatefulDataLoader."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader, TensorDataset

from tests.user.user_module import make_data


class ShuffledData(L.LightningDataModule):
    def __init__(self, stateful: bool, batch_size: int = 2) -> None:
        super().__init__()
        self.stateful, self.batch_size = stateful, batch_size
        x, y, vx, vy = make_data()
        self.train, self.val = TensorDataset(x, y), TensorDataset(vx, vy)

    def train_dataloader(self):
        if self.stateful:
            from torchdata.stateful_dataloader import StatefulDataLoader
            from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

            trainer = self.trainer
            if (
                trainer is not None and trainer.world_size > 1
            ):  # a sampler that resumes too (Trainer: no injection)
                sampler = StatefulDistributedSampler(
                    self.train,
                    num_replicas=trainer.world_size,
                    rank=trainer.global_rank,
                    shuffle=True,
                    seed=0,
                )
                return StatefulDataLoader(self.train, batch_size=self.batch_size, sampler=sampler)
            return StatefulDataLoader(self.train, batch_size=self.batch_size, shuffle=True)
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)
