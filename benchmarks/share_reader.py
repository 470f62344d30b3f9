"""Read speed of the split reader (Reader.share_dataset, one share) vs the block reader
(Reader.dataset), rows/s over one pass of a data file, each twice, alternating.

Example: python benchmarks/share_reader.py data/cache/<synthetic file>.txt
"""
import argparse
import time

import ttf

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("path", help="a Criteo-schema data file")
p.add_argument("--batch-size", type=int, default=256, help="rows per batch (default 256)")
args = p.parse_args()
r = ttf.data.CriteoReader([args.path])
for name, ds in [("dataset", lambda: r.dataset(args.batch_size, shuffle=True)),
                 ("share_dataset", lambda: r.share_dataset(args.batch_size))] * 2:
    t0 = time.perf_counter()
    n = sum(int(x[1].shape[0]) for x in ds())
    print(name, n, f"{n / (time.perf_counter() - t0):.0f} rows/s", flush=True)
