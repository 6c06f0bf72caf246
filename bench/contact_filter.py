"""Contact filter vs one-frame estimate, static and moving presses (docs/results.md, issue 23
"Presses while the arm moves: the contact filter").

Reads the ``summary.json`` of two runs of :mod:`nactuator.contact.experiment` (the static
presses and ``--motion sweep``) and plots, per residual source, link isolation and the median
point error of the old estimate (the hold's mean residual, one posture) and of the contact
filter (``contact.estimate.ContactFilter``, causal over the press's frames), fold mean +- std;
``exact`` is the labelled contact's own joint torque (no torque or dynamics error).

    PYTHONPATH=src python bench/contact_filter.py --static runs/contact/summary.json \
        --sweep runs/contact_sweep/summary.json --out docs/img/contact_filter_so101.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from nactuator.atomic import write_png

SOURCES = ("exact", "oracle_tared", "current_id_tared", "motor_tared", "motor_sweep_tared")


def plot(static: dict, sweep: dict, out: Path, sources: tuple[str, ...] = SOURCES) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(13, 4.0))
    bars = [(f"{nm}\n{kind}", s, nm)
            for kind, s in (("static", static), ("moving", sweep))
            for nm in sources if nm in s]
    x = np.arange(len(bars))
    for a, (old, new, label, target) in zip(ax, [
            ("isolation", "filter_isolation", "link isolation", 0.9),
            ("localisation_cm", "filter_localisation_cm", "median point error [cm]", 3.0)],
            strict=True):
        for off, key, lbl in ((-0.2, old, "one estimate (hold mean)"),
                              (0.2, new, "contact filter")):
            a.bar(x + off, [s[nm][key]["mean"] for _, s, nm in bars], 0.4,
                  yerr=[s[nm][key]["std"] for _, s, nm in bars], label=lbl)
        a.axhline(target, color="k", ls="--", lw=0.8)
        a.set_xticks(x, [b[0].replace("_tared", "") for b in bars], fontsize=7, rotation=30)
        a.set_ylabel(label)
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    write_png(out, fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--static", required=True)
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--out", default="docs/img/contact_filter_so101.png")
    a = ap.parse_args(argv)
    plot(json.loads(Path(a.static).read_text()), json.loads(Path(a.sweep).read_text()),
         Path(a.out))


if __name__ == "__main__":
    main()
