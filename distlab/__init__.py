"""distlab: a PyTorch Lightning toolkit for correct distributed training."""

__version__ = "0.1.0"
