from distlab.callbacks.loss_curve import LossCurvePlot
from distlab.callbacks.sample_text import SampleText

__all__ = ["LossCurvePlot", "SampleText"]
