from distlab.modules.classifier import ImageClassifier
from distlab.modules.gpt_module import GPTLightningModule
from distlab.modules.metrics import LanguageModelMetrics

__all__ = ["GPTLightningModule", "ImageClassifier", "LanguageModelMetrics"]
