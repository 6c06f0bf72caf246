"""nactuator.eval: the NAD evaluation protocol, metrics, references, plots and offline infer.

``evaluate(ckpt, data, split, out)`` rolls every episode of a split out open loop through
the simulator and writes metrics.json / metrics.md / PNGs; ``nactuator.eval.infer.infer``
is the deployment path (force, gate and condition from the recorded telemetry alone).
"""

from nactuator.eval.episodes import EvalDataError
from nactuator.eval.evaluation import evaluate

__all__ = ["EvalDataError", "evaluate"]
