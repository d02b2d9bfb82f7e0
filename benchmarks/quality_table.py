"""Streaming perplexity of SmolLM2 under full, window-only and sinks+window KV, per local text.

Runs `metronome quality`'s measurement (engine/quality.py) on every text source installed here
(Debian's fortunes, the GPL-3 text) and writes the table to docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/quality_table.py [--tokens 4096] [--windows 256 512] [--sinks 4]
                                                 [--granularities block token]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.report import machine, write_section  # noqa: E402
from engine.quality import FORTUNES_DIR, GPL3_FILE, QualitySettings, measure  # noqa: E402

TITLE = "Streaming perplexity (SmolLM2)"
TEXT_NAMES = {str(FORTUNES_DIR): "fortunes", str(GPL3_FILE): "GPL-3"}
DESIGN_REFERENCE = (
    "DESIGN.md quotes, for 4096 tokens and W = 256 (4 sinks): 17.6 / 37.4 / 21.0 on the GPL-3 "
    "text and 20.3 / 55.3 / 25.2 on fortunes (full / window-only / sinks+window); it does not "
    "say how the fortune files were joined nor at which granularity. Perplexity differs "
    "between fortune files, so fortunes rows compare only with the same assembly.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--windows", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--granularities", nargs="+", choices=["block", "token"],
                        default=["block", "token"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(message)s")

    sources = [path for path in (FORTUNES_DIR, GPL3_FILE) if path.exists()]
    rows = []
    for source in sources:
        for window in args.windows:
            for granularity in args.granularities:
                result = measure(QualitySettings(
                    model=args.model, window_tokens=window, sink_tokens=args.sinks,
                    n_tokens=args.tokens, granularity=granularity, text_path=str(source)))
                rows.append(result)
                print(_row(result), flush=True)

    command = " ".join([".venv/bin/python benchmarks/quality_table.py", *sys.argv[1:]])
    body = "\n".join([
        f"Command: `{command}`",
        f"Machine: {machine()}; transformers, fp32 on CPU, one masked forward pass per policy "
        "(absolute positions, an explicit mask of the keys each policy keeps).",
        f"Model: {args.model}. Texts: fortunes = the first {args.tokens} tokens of the files of "
        f"`{FORTUNES_DIR}` in name order, `%` separators as blank lines (a few thousand "
        f"tokens all come from the first file, `art`); GPL-3 = `{GPL3_FILE}`. Perplexity "
        "counts the predictions at positions t ≥ W + S (after the window has slid past the "
        "sinks). Granularity block: the sink blocks and the window "
        "from its first kept block (blocks of 32, what vLLM attends to after block-table "
        "compaction); token: exactly [0, S) ∪ (t−W, t]. Recovered: the share of the "
        "window-only loss that the sinks win back, (window − sinks) / (window − full).",
        "",
        "| text | tokens | W | S | granularity | scored | full | window-only | sinks+window "
        "| recovered | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(r) for r in rows),
        "",
        DESIGN_REFERENCE,
    ])
    print(f"wrote {write_section(TITLE, body)}")


def _row(r: dict) -> str:
    recovered = (r["ppl_window"] - r["ppl_sinks"]) / (r["ppl_window"] - r["ppl_full"])
    text = TEXT_NAMES.get(r["text_source"], r["text_source"])
    return (f"| {text} | {r['tokens']} | {r['window']} | {r['sinks']} | {r['granularity']} | "
            f"{r['scored_positions']} | {r['ppl_full']:.1f} | {r['ppl_window']:.1f} | "
            f"{r['ppl_sinks']:.1f} | {recovered:.0%} | {r['elapsed_s']:.0f} |")


if __name__ == "__main__":
    main()
