"""Damages a kvtier SSD tier's records on purpose, for the tests that prove a bad block is
recomputed (doc/disk_format.md)."""

import glob
import os


def _records(seg):
    """[(record offset, key bytes, payload length)] of a segment, in the order written."""
    with open(seg, "rb") as f:
        data = f.read()
    out, off = [], 4096
    while off < len(data) and data[off:off + 8] == b"KVTIERRC":
        payload = int.from_bytes(data[off + 32:off + 40], "little")
        out.append((off, data[off + 16:off + 32], payload))
        off += 4096 + (payload + 4095) // 4096 * 4096
    return out


def _flip(seg, off):
    with open(seg, "r+b") as f:
        f.seek(off + 4096 + 100)
        byte = f.read(1)[0]
        f.seek(off + 4096 + 100)
        f.write(bytes([byte ^ 0xFF]))


def corrupt_second_record(disk_dir):
    """Flips a payload byte of the second block stored (turn 1's block 1), see doc/disk_format.md."""
    seg = sorted(glob.glob(os.path.join(disk_dir, "seg-*.kvs")))[0]
    records = _records(seg)
    if len(records) < 2:
        raise AssertionError(f"no second record in {seg}")
    _flip(seg, records[1][0])
    return seg


def corrupt_key(disk_dir, key):
    """Flips a payload byte of every record stored under key (a kvtier.BlockKey), in every
    segment (a later process may have stored it again); returns how many."""
    want = key.hi.to_bytes(8, "little") + key.lo.to_bytes(8, "little")
    n = 0
    for seg in sorted(glob.glob(os.path.join(disk_dir, "seg-*.kvs"))):
        for off, k, payload in _records(seg):
            if k == want and payload:
                _flip(seg, off)
                n += 1
    return n
