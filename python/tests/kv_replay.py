"""vLLM's KV-event replay protocol, decoded with vLLM's own msgspec classes: what a router built
on vLLM's format does to catch up (used by test_events.py and vllm_run.py)."""

import msgspec
import zmq
from vllm.distributed import kv_events

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def decode(payload: bytes) -> kv_events.KVEventBatch:
    return msgspec.msgpack.decode(payload, type=kv_events.KVEventBatch)


def replay(endpoint: str, start_seq: int = 0) -> list[tuple[str, int, kv_events.KVEventBatch]]:
    """[identity, "", start_seq] in, [topic, seq, payload] per buffered batch out, then the
    END_SEQ marker."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 3000)
    s.connect(endpoint)
    s.send_multipart([b"", start_seq.to_bytes(8, "big")])
    out = []
    try:
        while True:
            _, topic, seq, payload = s.recv_multipart()
            if seq == END_SEQ:
                break
            out.append((topic.decode(), int.from_bytes(seq, "big"), decode(payload)))
    finally:
        s.close()
    return out
