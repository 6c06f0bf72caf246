"""Progress bars: redrawn on a terminal, whole lines at a bounded rate in a log."""

from __future__ import annotations

import io
import re

from tqdm import tqdm

from nactuator.progress import LogLines, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_log_gets_lines_not_carriage_returns():
    log = io.StringIO()
    bar = progress_bar(total=9, desc="cv so101 (9 folds)", unit="fold", file=log)
    assert isinstance(bar, LogLines)
    with bar:
        for _ in range(9):
            bar.update(1)
    lines = [re.sub(r"\d+ s$", "T s", line) for line in log.getvalue().splitlines()]
    assert "\r" not in log.getvalue()
    assert lines[0] == "cv so101 (9 folds): 0/9 fold (0 %), T s"
    assert lines[-1] == "cv so101 (9 folds): 9/9 fold (100 %), T s"
    assert all(re.fullmatch(r"cv so101 \(9 folds\): \d/9 fold \(\d+ %\), T s", x)
               for x in lines)  # at most one line per 30 s in between (timed above)


def test_log_lines_are_rate_limited_by_the_clock():
    log, clock = io.StringIO(), FakeClock()
    bar = LogLines(total=1000, desc="episode 1/1", unit="frame", file=log, interval_s=30.0,
                   clock=clock)
    for k in range(1000):  # 1000 frames at 10 per second: 100 s
        clock.t = k / 10
        bar.update(1)
        bar.set_postfix(rate="10.0Hz", dropped=0)
    bar.close()
    bar.close()  # closing twice prints nothing more
    lines = log.getvalue().splitlines()
    # start, then one line every 30 s (at 30, 60, 90 s), then the final state
    assert len(lines) == 5
    assert lines[1].startswith("episode 1/1: 301/1000 frame (30 %), 30 s | rate=10.0Hz")
    assert lines[-1].startswith("episode 1/1: 1000/1000 frame (100 %), 100 s")


def test_fractional_counts_and_a_disabled_bar():
    log = io.StringIO()
    with LogLines(total=3.0, desc="synth omx", unit="batch", file=log) as bar:
        bar.n = 1.25
        bar.refresh()
    assert log.getvalue().splitlines()[-1].startswith("synth omx: 1.25/3 batch (42 %), ")
    quiet = io.StringIO()
    with progress_bar(total=3, desc="x", file=quiet, disable=True) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_a_terminal_gets_a_tqdm_bar():
    term = Terminal()
    with progress_bar(total=4, desc="adapt omx", unit="run", file=term) as bar:
        assert isinstance(bar, tqdm)
        bar.update(4)
    assert "\r" in term.getvalue() and "4/4" in term.getvalue()
