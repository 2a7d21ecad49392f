"""Damages a kvtier SSD tier's records on purpose, for the tests that prove a bad block is
recomputed (doc/disk_format.md)."""

import glob
import os


def corrupt_second_record(disk_dir):
    """Flips a payload byte of the second block stored (turn 1's block 1), see doc/disk_format.md."""
    seg = sorted(glob.glob(os.path.join(disk_dir, "seg-*.kvs")))[0]
    with open(seg, "r+b") as f:
        data = f.read()
        off, seen = 4096, 0
        while off < len(data) and data[off:off + 8] == b"KVTIERRC":
            payload = int.from_bytes(data[off + 32:off + 40], "little")
            if seen == 1:
                f.seek(off + 4096 + 100)
                f.write(bytes([data[off + 4096 + 100] ^ 0xFF]))
                return seg
            seen += 1
            off += 4096 + (payload + 4095) // 4096 * 4096
    raise AssertionError(f"no second record in {seg}")
