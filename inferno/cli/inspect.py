"""``inferno inspect``: what the model looks at and what each layer would predict, for one text.

    inferno inspect "The quick brown fox"                 # every layer and head, at the last position
    inferno inspect "The quick brown fox" --layer 5 --head 3
    inferno inspect "The quick brown fox" --json          # the weights and the lens as one JSON object

The terminal view shows, for one position (the last unless --position), the tokens each head attends to
most and the logit lens layer by layer (`Pipeline.inspect`, `inferno.inspect`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from inferno.cli._args import (
    CliError,
    Parser,
    add_model_args,
    check_utf8,
    count,
    load,
    non_negative,
    positive,
)
from inferno.jobs.fits import too_long

#: The flag that carries each argument of `Pipeline.inspect`, for error messages.
FLAGS = {"layers": "--layer", "heads": "--head", "positions": "--position", "top": "--top", "ids": "TEXT"}
#: Keys shown per head in the terminal view.
KEYS_SHOWN = 3


def run(argv: Sequence[str]) -> int:
    p = Parser(prog="inferno inspect", description="Look inside the model: for one position of TEXT (the "
               "last by default), the tokens every attention head attends to most, and what every layer "
               "would predict next (the logit lens: each layer's residual stream through the final layer "
               "norm and the LM head).")
    p.add_argument("text", metavar="TEXT", help="the text to inspect (at most the model's context long)")
    add_model_args(p)
    p.add_argument("--layer", type=non_negative, metavar="L", help="only block L's attention (0-based; "
                   "default: every block)")
    p.add_argument("--head", type=non_negative, metavar="H", help="only head H of each block shown "
                   "(default: every head)")
    p.add_argument("--position", type=int, metavar="P", help="the position shown (0-based; negative "
                   "counts from the end; default -1, the last token)")
    p.add_argument("--top", type=positive, default=5, metavar="N",
                   help="tokens of the logit lens per layer (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object: ids, tokens, layers, heads, "
                   "position, attention ([layer][head][query][key], every query), logit_lens ([layer] → "
                   "the top tokens at the position)")
    args = p.parse_args(argv)
    import numpy as np  # here, not at import: `inferno --help` stays cheap

    args.text = check_utf8(args.text, "TEXT")
    pipe = load(args)
    reason = too_long(pipe.tokenizer, args.text, pipe.config.n_positions, "TEXT")
    if reason:
        raise CliError(reason)
    ids = pipe.encode(args.text)
    position = -1 if args.position is None else args.position
    if not -len(ids) <= position < len(ids):
        raise CliError(f"--position {position}: the text has {count(len(ids), 'token')} (positions 0 to "
                       f"{len(ids) - 1}, or -1 for the last)")
    position %= len(ids)
    from inferno.inspect import InspectionError

    try:
        result = pipe.inspect(ids, layers=args.layer, heads=args.head, positions=[position], top=args.top)
    except InspectionError as exc:
        raise CliError(f"{FLAGS.get(exc.param, exc.param)}: {exc}") from None
    lens = [layer[0] for layer in result.logit_lens]
    if args.json:
        print(json.dumps({
            "ids": result.ids, "tokens": result.tokens, "layers": result.layers, "heads": result.heads,
            "position": position, "attention": np.round(result.attention.astype(np.float64), 4).tolist(),
            "logit_lens": [[{"id": i, "token": pipe.tokenizer.decode([i]), "probability": prob}
                            for i, prob in pairs] for pairs in lens]}))
        return 0
    tokens = result.tokens
    print(f"{len(ids)} tokens; position {position} is {tokens[position]!r}")
    print(f"\nattention of position {position}: the {KEYS_SHOWN} tokens each head attends to most")
    for a, layer in enumerate(result.layers):
        for b, head in enumerate(result.heads):
            row = result.attention[a, b, position, : position + 1]
            best = np.argsort(-row, kind="stable")[:KEYS_SHOWN]
            shown = "  ".join(f"{j}:{tokens[j]!r} {row[j]:.3f}" for j in best)
            print(f"  layer {layer:>2} head {head:>2}  {shown}")
    print(f"\nlogit lens at position {position}: what each layer would predict next")
    last = len(lens) - 1
    for layer, pairs in enumerate(lens):
        name = "embedding" if layer == 0 else "output" if layer == last else f"block {layer - 1}"
        shown = "  ".join(f"{pipe.tokenizer.decode([i])!r} {prob:.3f}" for i, prob in pairs)
        print(f"  layer {layer:>2} {name:<9}  {shown}")
    return 0
