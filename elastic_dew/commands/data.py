"""``elastic-dew data prepare --out DIR TEXT_FILE...``: text files into ArrayRecord shards for ``lm``.

The text is tokenized with the ``lm`` recipe's character vocabulary and cut into examples of
``--seq-len`` + 1 tokens in ``--shards`` ArrayRecord files (:mod:`elastic_dew.recipes.data.files`);
``elastic-dew train lm --set data=DIR`` trains on them, ``--set data_workers=N`` through
Grain worker processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from elastic_dew.run import USAGE_EXIT

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    from elastic_dew.cli import HelpFormatter

    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    sub.required = True
    description = "Tokenize UTF-8 text files into ArrayRecord shards that `elastic-dew train lm --set data=DIR` reads."
    p = sub.add_parser("prepare", help="tokenize text files into ArrayRecord shards", description=description,
                       formatter_class=HelpFormatter)
    p.add_argument("texts", nargs="+", type=Path, metavar="TEXT_FILE", help="UTF-8 text files, read in this order")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new (or empty) directory for the shards")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per example the model sees (each record holds one more)")
    p.add_argument("--shards", type=int, default=4, help="ArrayRecord files to split the examples over")


def run(args: argparse.Namespace) -> int:
    from elastic_dew.recipes.data.files import prepare

    try:
        manifest = prepare(args.texts, args.out, seq_len=args.seq_len, shards=args.shards)
    except ValueError as error:
        print(f"elastic-dew data {args.data_command}: error: {error}", file=sys.stderr)
        return USAGE_EXIT
    print(
        f"{manifest['examples']} examples of {manifest['seq_len'] + 1} tokens in {len(manifest['shards'])} "
        f"shards under {args.out} ({manifest['dropped_characters']} characters outside the vocabulary dropped)"
    )
    print(f"train on them: elastic-dew train lm --set data={args.out}")
    return 0
