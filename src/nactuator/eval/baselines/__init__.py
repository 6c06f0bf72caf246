"""Classical baselines beside the learned actuator (issue 12; SPEC §6), one module per family.

| module | family |
|---|---|
| ``calibration`` | 1. per-joint current-to-torque map ``Kt * u + b`` from free motion |
| ``id_linear`` | 2. ID-Linear: ``tau_ext = tau_ID(q, qd, qdd) - (Kt * u + b)`` |
| ``id_friction`` | 3. ID-Friction: + Coulomb, viscous, Stribeck friction and a backlash dead zone |
| ``momentum_observer`` | 4. generalized momentum observer (De Luca & Mattone 2005) |
| ``force_map`` | 5. ``f = (J_v^T)^+ tau_ext`` and the contact decision ``|f| > threshold`` |
| ``features``, ``condition`` | 6. 20 window features; threshold, SVM-RBF, random forest |
| ``suite`` | 7. fit on the train split, score in the evaluation's tables |

``signals`` holds what they share (recorded state, causal qdd, inverse dynamics from
:mod:`nactuator.sim.dynamics`), ``settings`` the fixed parameters of
``conf/eval/baselines.yaml``. See docs/evaluation.md, "Classical baselines".
"""

from nactuator.eval.baselines.settings import BaselineSettings, load_settings
from nactuator.eval.baselines.suite import (
    ALL_METHODS,
    FORCE_METHODS,
    FittedBaselines,
    fit_baselines,
    parse_baselines,
    score_baselines,
)

__all__ = ["ALL_METHODS", "FORCE_METHODS", "BaselineSettings", "FittedBaselines",
           "fit_baselines", "load_settings", "parse_baselines", "score_baselines"]
