import lightning as L

from distlab.callbacks.early_stopping import NonFiniteLossError, SyncEarlyStopping
from distlab.callbacks.fault_injection import FaultInjection, InjectedFault
from distlab.callbacks.given_as_class import refuse_the_class_for_an_instance
from distlab.callbacks.loss_curve import LossCurvePlot
from distlab.callbacks.preemption import CheckpointOnStopRequest, DataResumeCheck, SaveUnsavedSteps
from distlab.callbacks.rank_zero_validation import RankZeroValidation
from distlab.callbacks.resume import ConfiguredOptimizerSettings
from distlab.callbacks.sample_text import SampleText
from distlab.callbacks.speed import SpeedMonitor

__all__ = [
    "CheckpointOnStopRequest",
    "ConfiguredOptimizerSettings",
    "DataResumeCheck",
    "FaultInjection",
    "InjectedFault",
    "LossCurvePlot",
    "NonFiniteLossError",
    "RankZeroValidation",
    "SampleText",
    "SaveUnsavedSteps",
    "SpeedMonitor",
    "SyncEarlyStopping",
]

for _name in __all__:  # Trainer(callbacks=[SpeedMonitor]) (no parentheses) is named in one line
    if isinstance(globals()[_name], type) and issubclass(globals()[_name], L.Callback):
        refuse_the_class_for_an_instance(globals()[_name])
