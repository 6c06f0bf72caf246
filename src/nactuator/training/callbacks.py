"""Small Lightning callbacks of the training room."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar

from nactuator.atomic import write_json, write_text


class LossReport(L.Callback):
    """Prints the training loss at the start and end of a fit, and how much it dropped.

    "Start" and "end" are the mean of the first and last ``window`` logged steps, so one
    noisy batch does not decide the reported figure.
    """

    def __init__(self, key: str = "train/loss", window: int = 3) -> None:
        self.key = key
        self.window = max(int(window), 1)
        self.losses: list[float] = []
        self._started = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.losses = []
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        value = trainer.callback_metrics.get(self.key)
        if value is not None:
            self.losses.append(float(value))

    def summary(self) -> dict[str, float]:
        finite = [x for x in self.losses if math.isfinite(x)]
        if not finite:
            return {}
        first = sum(finite[: self.window]) / len(finite[: self.window])
        last = sum(finite[-self.window :]) / len(finite[-self.window :])
        return {"steps": len(self.losses), "start": first, "end": last,
                "ratio": first / last if last > 0 else math.inf,
                "seconds": time.perf_counter() - self._started}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        s = self.summary()
        if s and trainer.is_global_zero:
            print(
                f"[nactuator] {self.key} (mean of the first/last {self.window} steps): "
                f"start {s['start']:.4g} -> end {s['end']:.4g} ({s['ratio']:.1f}x lower) "
                f"over {s['steps']} steps in {s['seconds']:.0f} s",
                flush=True,
            )


class FinalMetrics(L.Callback):
    """Writes the run's last logged metrics (``trainer.callback_metrics``) to a JSON file
    at the end of fit/validate/test; the local sweep driver reads them back."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _dump(self, trainer: L.Trainer) -> None:
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if getattr(v, "numel", lambda: 1)() == 1}
        metrics["global_step"] = trainer.global_step
        metrics["epoch"] = trainer.current_epoch
        write_text(self.path, json.dumps(metrics, indent=2))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._dump(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn != "fit":
            self._dump(trainer)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._dump(trainer)


class TorchThreads(L.Callback):
    """Sets torch's intra-op CPU threads for the run (default 1).

    Warp's CPU kernels are single-threaded and the per-step models are tiny, so extra
    torch threads mostly contend with the simulator and with other processes (DDP ranks);
    one thread per process measured 3x faster training steps on a loaded 2-core machine.
    """

    def __init__(self, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        torch.set_num_threads(self.threads)


class EpochLines(ProgressBar):
    """Lightning's progress for a log file or a pipe: one line per training epoch with the
    progress-bar metrics, instead of a tqdm bar redrawn with carriage returns. LightningCLI
    puts it in place of the default bar when stdout is not a terminal (training/cli.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items()
                   if k != "v_num"}
        shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in metrics.items())
        total = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        print(f"[nactuator] epoch {trainer.current_epoch + 1}{total}, step "
              f"{trainer.global_step}: {shown}", flush=True)


CLOCK_FILE = "clock.json"  # written by AdaptClock, read by experiments.adapt


class AdaptClock(L.Callback):
    """Writes ``clock.json`` in the run's root: wall seconds since the start of training
    at the end of every epoch (what the error-vs-time curve is plotted against), and the
    process's CPU seconds over the same span (on a shared machine the wall time says how
    busy it was; the CPU time says what the fine-tune costs on one free core)."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.cpu_start = 0.0
        self.epochs: list[dict[str, float]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()
        self.epochs = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or self.start is None:
            return
        self.epochs.append({"epoch": trainer.current_epoch, "step": trainer.global_step,
                            "seconds": time.perf_counter() - self.start,
                            "cpu_seconds": time.process_time() - self.cpu_start})
        write_json(Path(trainer.default_root_dir) / CLOCK_FILE, {"epochs": self.epochs})
