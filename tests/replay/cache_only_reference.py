#!/usr/bin/env python3
"""Independent reference for kvtier's cache-only replay (doc/replay.md), written from the
definition only: it shares no code with the C++ replay.

Usage: cache_only_reference.py [--capacity-tokens N] TRACE_OR_FOLDER...
Prints one line per result: "<policy> <requests> <prompt_tokens> <hit_tokens>" for ideal, and for
lru and lru-tail when a capacity is given.
"""
import json
import os
import sys
from collections import OrderedDict


def files_of(paths):
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += [os.path.join(p, n) for n in sorted(os.listdir(p))
                    if n.endswith('.json') or n.endswith('.jsonl')]
        else:
            out.append(p)
    return out


def load(paths):
    """Requests as (start, file index, order, namespace, block, prompt, ids), replay-sorted."""
    reqs = []
    for fi, path in enumerate(files_of(paths)):
        text = open(path).read()
        first = text.lstrip().split('\n', 1)[0]
        if '"input_length"' in first and '"requests"' not in first:
            for order, line in enumerate(l for l in text.split('\n') if l.strip()):
                r = json.loads(line)
                reqs.append((r['timestamp'] / 1000.0, fi, order, 'mooncake:' + path, 512,
                             r['input_length'], r['hash_ids']))
            continue
        d = json.loads(text)
        ns = 'agentx:' + (d.get('id') or path) if d.get('hash_id_scope', 'local') == 'local' \
            else 'agentx:global'
        counter = [0]

        def walk(requests, start):
            for r in requests:
                if r['type'] == 'subagent':
                    walk(r['requests'], start + r['t'])
                else:
                    reqs.append((start + r['t'], fi, counter[0], ns, d['block_size'], r['in'],
                                 r['hash_ids']))
                    counter[0] += 1
        walk(d['requests'], 0.0)
    reqs.sort(key=lambda q: (q[0], q[1], q[2]))
    return reqs


def chain(ns, ids):
    # A key stands for its whole prefix (equal key <=> equal prefix): the parent's key with the id.
    keys, parent = [], hash(('root', ns))
    for i in ids:
        parent = hash((parent, i))
        keys.append(parent)
    return keys


def replay(reqs, capacity_tokens, order):
    cache = OrderedDict()  # key -> None, most recent last
    hit = total = 0
    for _, _, _, ns, block, prompt, ids in reqs:
        keys = chain(ns, ids)
        matched = 0
        for k in keys:
            if k not in cache:
                break
            matched += 1
        hit += min(matched * block, prompt)
        total += prompt
        cap = None if capacity_tokens is None else capacity_tokens // block
        for k in (keys if order == 'head' else reversed(keys)):
            if k in cache:
                cache.move_to_end(k)
            else:
                cache[k] = None
                while cap is not None and len(cache) > cap:
                    cache.popitem(last=False)
    return len(reqs), total, hit


def main(argv):
    capacity = None
    if len(argv) >= 2 and argv[0] == '--capacity-tokens':
        capacity = int(argv[1])
        argv = argv[2:]
    reqs = load(argv)
    print('ideal %d %d %d' % replay(reqs, None, 'head'))
    if capacity is not None:
        print('lru %d %d %d' % replay(reqs, capacity, 'head'))
        print('lru-tail %d %d %d' % replay(reqs, capacity, 'tail'))


if __name__ == '__main__':
    main(sys.argv[1:])
