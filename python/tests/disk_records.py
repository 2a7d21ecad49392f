"""Damages a kvtier SSD tier's records on purpose, for the tests that prove a bad block is
recomputed (doc/disk_format.md)."""

import glob
import os


def _records(disk_dir):
    """(segment path, [(record offset, payload bytes)]) of the first segment, in store order."""
    seg = sorted(glob.glob(os.path.join(disk_dir, "seg-*.kvs")))[0]
    with open(seg, "rb") as f:
        data = f.read()
    out, off = [], 4096
    while off < len(data) and data[off:off + 8] == b"KVTIERRC":
        payload = int.from_bytes(data[off + 32:off + 40], "little")
        out.append((off, data[off + 4096:off + 4096 + payload]))
        off += 4096 + (payload + 4095) // 4096 * 4096
    return seg, out


def _flip(seg, off):
    with open(seg, "r+b") as f:
        f.seek(off + 4096 + 100)
        byte = f.read(1)[0]
        f.seek(off + 4096 + 100)
        f.write(bytes([byte ^ 0xFF]))


def corrupt_second_record(disk_dir):
    """Flips a payload byte of the second block stored (turn 1's block 1), see doc/disk_format.md."""
    seg, records = _records(disk_dir)
    if len(records) < 2:
        raise AssertionError(f"no second record in {seg}")
    _flip(seg, records[1][0])
    return seg


def corrupt_resume_record(disk_dir, n):
    """Flips a payload byte of the n-th (from 0) block stored under a resume key. A block holding
    its state is stored under its chain key, then again under its resume key: records with equal
    payloads, the chain key's first; every later one of the n-th such payload is damaged (a
    later process may have stored the block again)."""
    seg, records = _records(disk_dir)
    groups: dict = {}
    for off, payload in records:
        groups.setdefault(payload, []).append(off)
    repeated = [offs for offs in groups.values() if len(offs) > 1]  # in first-store order
    if len(repeated) <= n:
        raise AssertionError(f"{len(repeated)} blocks stored under resume keys in {seg}; "
                             f"wanted the {n + 1}th")
    for off in repeated[n][1:]:
        _flip(seg, off)
    return seg
