from distlab.modules.gpt_module import GPTLightningModule
from distlab.modules.metrics import LanguageModelMetrics

__all__ = ["GPTLightningModule", "LanguageModelMetrics"]
