"""How long a store keeps the caller: kvtier.AsyncStore.submit against the synchronous
store_keys, same cache, same block size, paired and interleaved.

    python -m kvtier.bench.store_async [--block-bytes 1MiB] [--blocks 1] [--reps 41]
                                        [--socket PATH]

Each rep stores fresh keys twice (one synchronously, one through the queue, in alternating
order) and records how long each call held the caller; the queue is drained between calls, so
the two never overlap. Prints the medians and the median of the paired ratios (async / sync).
--socket: through that `kvtier serve` daemon (its layout must be this one: fp16, 1 layer, 8 KV
heads, head_dim 64, block_tokens = the size asked); else an in-process host tier.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import kvtier


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * m)
    return int(text)


def layout_for(block_bytes: int) -> kvtier.KvLayout:
    # 1 layer x K,V x 8 heads x 64 dims x fp16 = 2 KiB per token.
    per_token = 2 * 8 * 64 * 2
    if block_bytes % per_token:
        raise SystemExit(f"--block-bytes {block_bytes}: want a multiple of {per_token}")
    return kvtier.KvLayout(num_layers=1, num_kv_heads=8, head_dim=64, dtype="fp16",
                           block_tokens=block_bytes // per_token)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-bytes", default="1MiB")
    ap.add_argument("--blocks", type=int, default=1, help="blocks per store")
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--socket", default="", help="a kvtier serve daemon's socket")
    ap.add_argument("--nice", default="idle", help="the store thread: idle, a level, or none")
    args = ap.parse_args(argv)
    layout = layout_for(parse_size(args.block_bytes))
    bt = layout.block_tokens
    n = args.blocks
    if args.socket:
        cache = kvtier.Client.connect(layout, socket=args.socket, model_id="bench-store-async")
        where = f"daemon {args.socket}"
    else:
        cap = 4 * (args.reps + 2) * n * layout.bytes_per_block
        cache = kvtier.open_cache(layout, [kvtier.host_tier(cap)], model_id="bench-store-async")
        where = "in process, host tier"
    data = np.random.default_rng(1).integers(0, 255, size=(n, layout.bytes_per_block),
                                             dtype=np.uint8)
    saver = kvtier.AsyncStore(cache, nice=args.nice if args.nice != "none" else None)
    sync_s, async_s, ratios = [], [], []
    seq = [int(time.time_ns()) & 0x7FFFFFFF]  # keys no earlier run stored (a daemon keeps them)

    def fresh():
        seq[0] += 1
        return kvtier.hash_prefix(cache.root(), bt, [seq[0] & 0xFFFFFFFF] * (bt * n))

    def timed_sync():
        keys = fresh()
        t0 = time.perf_counter()
        cache.store_keys(keys, data)
        return time.perf_counter() - t0

    def timed_async():
        keys = fresh()
        t0 = time.perf_counter()
        ok = saver.submit([(keys, data, 0, "", "")])
        dt = time.perf_counter() - t0
        if not ok:
            raise SystemExit("the store queue refused a batch")
        saver.wait_idle(30)
        return dt

    timed_sync(), timed_async()  # warm: connections, pages, the thread
    for rep in range(args.reps):
        if rep % 2:
            a = timed_async()
            s = timed_sync()
        else:
            s = timed_sync()
            a = timed_async()
        sync_s.append(s)
        async_s.append(a)
        ratios.append(a / s)
    saver.close()
    med = statistics.median
    print(f"store_async: {where}, {n} x {layout.bytes_per_block} B per store, {args.reps} "
          f"paired reps")
    print(f"  sync store_keys   median {med(sync_s) * 1e6:9.1f} us")
    print(f"  AsyncStore.submit median {med(async_s) * 1e6:9.1f} us")
    print(f"  async / sync      median {med(ratios):.4f} (p10 "
          f"{statistics.quantiles(ratios, n=10)[0]:.4f}, p90 "
          f"{statistics.quantiles(ratios, n=10)[-1]:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
