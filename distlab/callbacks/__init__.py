"""Callbacks: exact validation on any number of ranks, synchronized early stopping, speed, saves that lose nothing."""

from distlab.callbacks.early_stopping import NonFiniteLossError, SyncEarlyStopping
from distlab.callbacks.fault_injection import FaultInjection, InjectedFault
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
