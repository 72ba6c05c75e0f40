import distlab.strategies  # noqa: F401  (registers the strategy names with Lightning)
from distlab.modules.gpt_module import GPTLightningModule
from distlab.modules.metrics import LanguageModelMetrics

__all__ = ["GPTLightningModule", "LanguageModelMetrics"]
