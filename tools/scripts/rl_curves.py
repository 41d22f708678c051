#!/usr/bin/env python3
"""Draw the reward and regulariser curves of GRPO runs as one PNG.

    rl_curves.py OUT.png RUN.jsonl [RUN.jsonl ...]

Each RUN.jsonl is a metrics file of the RL trainer (one object per step
with "step", "reward_mean", "kl", "entropy", "reg_share", ...; lines of the
form {"event": {...}} are the collapse monitor's events). Three panels share
the step axis: mean reward, the regulariser's gradient share over the
policy term's (log scale), and KL to the reference. Each monitor event is a
marker on its run's reward curve at the step it fired. The legend names a
run by its file name without .jsonl.

Exit codes: 0 drawn, 2 bad input (one line naming the file and line),
3 matplotlib missing or the PNG not written.
"""
import json
import os
import sys


def load(path):
    steps, events = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                raise SystemExit2("%s:%d: not JSON" % (path, n))
            if not isinstance(d, dict):
                raise SystemExit2("%s:%d: not an object" % (path, n))
            if "event" in d:
                events.append(d["event"])
                continue
            for k in ("step", "reward_mean", "reg_share", "kl"):
                if not isinstance(d.get(k), (int, float)):
                    raise SystemExit2("%s:%d: '%s' missing or not a number" % (path, n, k))
            steps.append(d)
    if not steps:
        raise SystemExit2("%s: no metrics lines" % path)
    return steps, events


class SystemExit2(Exception):
    pass


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: rl_curves.py OUT.png RUN.jsonl [RUN.jsonl ...]\n")
        return 2
    try:
        runs = [(p, *load(p)) for p in argv[2:]]
    except OSError as e:
        sys.stderr.write("rl_curves: %s\n" % e)
        return 2
    except SystemExit2 as e:
        sys.stderr.write("rl_curves: %s\n" % e)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("rl_curves: matplotlib is not installed\n")
        return 3
    fig, ax = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for path, steps, events in runs:
        name = os.path.basename(path)
        if name.endswith(".jsonl"):
            name = name[:-6]
        x = [d["step"] for d in steps]
        r = [d["reward_mean"] for d in steps]
        line, = ax[0].plot(x, r, label=name, linewidth=1)
        ax[1].plot(x, [max(d["reg_share"], 1e-6) for d in steps], color=line.get_color(),
                   linewidth=1)
        ax[2].plot(x, [d["kl"] for d in steps], color=line.get_color(), linewidth=1)
        by_step = {d["step"]: d["reward_mean"] for d in steps}
        for e in events:
            s = e.get("step")
            if s in by_step:
                ax[0].plot([s], [by_step[s]], marker="v", markersize=9,
                           color=line.get_color())
                ax[0].annotate(e.get("rule", "?"), (s, by_step[s]), fontsize=7,
                               xytext=(3, 6), textcoords="offset points")
    ax[0].set_ylabel("mean reward")
    ax[0].legend(fontsize=7, ncol=2)
    ax[1].set_yscale("log")
    ax[1].set_ylabel("regulariser / policy\ngradient share")
    ax[1].axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax[2].set_ylabel("KL to reference")
    ax[2].set_xlabel("step")
    fig.tight_layout()
    try:
        fig.savefig(argv[1], dpi=110)
    except OSError as e:
        sys.stderr.write("rl_curves: %s: %s\n" % (argv[1], e))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
