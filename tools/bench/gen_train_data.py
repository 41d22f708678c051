#!/usr/bin/env python3
"""gen_train_data.py: the token ids both sides of the trainer benchmark
train on, as a JSONL file of the plan's "jsonl" data source: N sequences of
exactly SEQ ids drawn uniformly from [0, VOCAB) with a fixed seed, every
token but the first a target (mstrain's default without "loss_mask", and
what labels = input_ids means to transformers).

The same file feeds train_torch.py --data, so the two sides route the same
tokens: a MoE step's cost depends on how evenly the router spreads them,
and the synthetic tasks' ten-symbol alphabet would send every token of a
symbol to the same experts in the first layer.

    gen_train_data.py OUT.jsonl --vocab V --seq S --examples N [--seed 0]
"""
import argparse
import json
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--examples", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.vocab < 2 or a.seq < 2 or a.examples < 1:
        ap.error("--vocab and --seq must be at least 2, --examples at least 1")
    rng = random.Random(a.seed)
    try:
        with open(a.out, "w") as f:
            for _ in range(a.examples):
                ids = [rng.randrange(a.vocab) for _ in range(a.seq)]
                f.write(json.dumps({"input_ids": ids}, separators=(",", ":")) + "\n")
    except OSError as e:
        print("gen_train_data: %s: %s" % (a.out, e.strerror), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
