"""Preparation time and teacher-forced agreement of the embedded drafts (figures only, no assertions).

    .venv/bin/python benchmarks/model_agreement.py                  # read the prepared manifests
    .venv/bin/python benchmarks/model_agreement.py --fresh /tmp/mc  # time a full prepare into a scratch cache
    .venv/bin/python benchmarks/model_agreement.py --remeasure      # redo the teacher-forced passes now

Agreement texts: --data (GSM8K-format jsonl), else $SPECBOOK_AGREEMENT_DATA, else the built-in set.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specbook.models import EMBEDDED_MODELS, TARGET, model_info, prepare_models
from specbook.models import agreement as agr


def _remeasure(folders: dict[str, Path], data: Path | None) -> dict[str, dict]:
    from transformers import AutoTokenizer

    label, pairs = agr.agreement_pairs(data)
    texts = agr.encode_pairs(AutoTokenizer.from_pretrained(str(folders[TARGET])), label, pairs)
    t0 = time.monotonic()
    target = agr.top1_predictions(folders[TARGET], texts)
    out = {TARGET: {"seconds": time.monotonic() - t0}}
    for name, folder in folders.items():
        if EMBEDDED_MODELS[name].role != "draft":
            continue
        t0 = time.monotonic()
        got = agr.agreement_from_predictions(target, agr.top1_predictions(folder, texts), texts)
        out[name] = {**got, "seconds": time.monotonic() - t0, "text_set": label}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fresh", type=Path, default=None, help="prepare into this scratch cache (forced) and time it")
    ap.add_argument("--remeasure", action="store_true", help="redo the teacher-forced passes now")
    ap.add_argument("--data", type=Path, default=None, help="GSM8K-format jsonl for the agreement texts")
    args = ap.parse_args()

    t0 = time.monotonic()
    folders = prepare_models(cache=args.fresh, force=args.fresh is not None, agreement_data=args.data)
    print(f"prepare_models: {time.monotonic() - t0:.1f} s wall ({'fresh' if args.fresh else 'verify/skip'})")

    print(f"{'model':34} {'role':6} {'prepare_s':>9} {'agree':>7} {'agree_all':>9} {'n':>6} {'AL@k=4':>7}  text set")
    for name in folders:
        info = model_info(name, cache=args.fresh)
        a = info.get("agreement") or {}
        print(
            f"{name:34} {info['role']:6} {info['prepare_s']:9.1f} "
            f"{a.get('top1_agreement', float('nan')):7.4f} {a.get('top1_agreement_all_positions', float('nan')):9.4f} "
            f"{a.get('positions', 0):6d} {a.get('expected_acceptance_length', float('nan')):7.3f}  {a.get('text_set', '-')}"
        )

    if args.remeasure:
        for name, r in _remeasure(folders, args.data).items():
            if name == TARGET:
                print(f"remeasure {name}: teacher-forced pass {r['seconds']:.1f} s")
                continue
            al = agr.expected_acceptance_length(r["top1_agreement"], agr.AGREEMENT_K)
            print(
                f"remeasure {name}: agreement {r['top1_agreement']:.4f} (all {r['top1_agreement_all_positions']:.4f}) "
                f"AL@k=4 {al:.3f} on {r['text_set']}, pass {r['seconds']:.1f} s"
            )


if __name__ == "__main__":
    main()
