"""Plan KV pools for a model and a workload: how the ratio trades concurrency for cache reuse.

    python examples/plan_pools.py [PRESET] [AVG_SEQ_LEN]

For each ratio, the tokens the full and SWA pools hold in a fixed budget, and the concurrency a
workload of average length T can reach; the seed's estimate (W + I + P) / T marks the smallest
ratio worth considering.
"""

import sys

from swajax.capacity import capacity_report
from swajax.presets import load_preset


def main(preset="mimo-v2-flash", avg_seq_len=24_576, budget_gib=40.0):
    cfg = load_preset(preset)
    budget = int(budget_gib * 2**30)
    rows = []
    for ratio in (0.8, 0.4, 0.1, 0.05, 0.02):
        r = capacity_report(cfg, budget, ratio=ratio, page_size=16, avg_seq_len=avg_seq_len)
        rows.append(
            (
                ratio,
                r.full_tokens,
                r.swa_tokens,
                r.full_tokens // avg_seq_len,
                r.capacity_ratio,
                r.min_ratio_estimate,
            )
        )
    print(f"{preset}, {budget_gib:g} GiB bf16 KV, average sequence {avg_seq_len} tokens")
    print(f"{'ratio':>6} {'full':>10} {'SWA':>9} {'requests':>9} {'vs 1 pool':>9}")
    for ratio, full, swa, reqs, cap, _ in rows:
        print(f"{ratio:>6} {full:>10,} {swa:>9,} {reqs:>9} {cap:>8.2f}x")
    print(f"minimum useful ratio (W + I + P) / T = {rows[0][5]:.4f}")
    return rows


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "mimo-v2-flash", int(args[1]) if len(args) > 1 else 24_576)
