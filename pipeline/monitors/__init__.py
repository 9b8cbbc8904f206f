"""Threshold monitors and heavy-hitter detection (library, no I/O). See docs/monitors.md."""

from .calibration import (
    TargetChargingAccountant,
    TCTBound,
    calibrate_individual_charging,
    calibrate_naive,
    calibrate_outside_interval,
    calibrate_outside_interval_pure,
    calibrate_svt_restart,
    calibrate_threshold_monitor,
    individual_charging_privacy,
    naive_privacy,
    not_prior_q,
    outside_interval_privacy,
    outside_interval_privacy_simplified,
    outside_interval_pure_privacy,
    svt_restart_privacy,
    tct_hits_per_user,
    theorem_3_2_xi,
    threshold_monitor_noise,
    threshold_monitor_privacy,
)
from .heavy_hitters import METHODS, ShiftingHeavyHitters, heavy_hitter_plan
from .interval import (
    ABOVE,
    BELOW,
    BETWEEN,
    BandMonitor,
    OutsideIntervalMonitor,
    OutsideIntervalMonitorPure,
)
from .tct import IndividualChargingSVT
from .threshold import AboveThreshold, ThresholdMonitor, ThresholdMonitorEvolving

__all__ = [
    "AboveThreshold", "ThresholdMonitor", "ThresholdMonitorEvolving", "IndividualChargingSVT",
    "TargetChargingAccountant", "TCTBound", "OutsideIntervalMonitor", "OutsideIntervalMonitorPure",
    "BandMonitor", "BETWEEN", "ABOVE", "BELOW", "ShiftingHeavyHitters", "METHODS", "heavy_hitter_plan",
    "theorem_3_2_xi", "threshold_monitor_noise", "threshold_monitor_privacy", "calibrate_threshold_monitor",
    "not_prior_q", "tct_hits_per_user", "individual_charging_privacy", "calibrate_individual_charging",
    "svt_restart_privacy", "calibrate_svt_restart", "naive_privacy", "calibrate_naive",
    "outside_interval_privacy", "outside_interval_privacy_simplified", "calibrate_outside_interval",
    "outside_interval_pure_privacy", "calibrate_outside_interval_pure",
]
