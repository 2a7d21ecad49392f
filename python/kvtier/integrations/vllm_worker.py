"""The worker half of kvtier's vLLM connector (KvtierConnector mixes it in): registers vLLM's
paged KV, loads planned blocks into it (synchronously, or on the loader thread), copies the
blocks each step completed out of it for the saver. Imported by vllm.py after its version
check."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)

import kvtier
from kvtier.integrations.background import StagingPool, engine_hashes
from kvtier.integrations.paged import GroupedPaged, PagedKv, StatePages, layer_order
from kvtier.integrations.vllm_support import (
    KvtierConnectorMetadata,
    KvtierWorkerMetadata,
    _LoadOutcome,
    _timed,
    _Transfer,
    logger,
)

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata

# A load's scratch: host blocks are lent this many bytes at a time (the tier's reader lock is
# held that long); blocks the cache cannot lend go through it, each chunk written into vLLM's
# pages while it is still in the CPU's cache.
LOAD_CHUNK_BYTES = 4 << 20


class WorkerHalf:
    """KvtierConnector's worker-side hooks; the state they use is set in its __init__."""


    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        parts = []
        try:
            for gi, g in enumerate(self._groups):
                names = layer_order(g.layer_names)
                missing = [n for n in names if n not in kv_caches]
                if missing:
                    raise ValueError(f"no KV tensor for layer {missing[0]} of group {gi}")
                layers = [kv_caches[n] for n in names]
                parts.append(StatePages(layers, self._layout, gi, names) if g.kind == "state" else
                             PagedKv(layers, self._layout, g.page_tokens, names,
                                     gi if self._layout.grouped else -1))
        except ValueError as e:
            raise ValueError(f"kvtier connector: {e}") from None
        self._paged = GroupedPaged(parts)
        self._staging = StagingPool(self._paged.staging)
        logger.info("kvtier connector: %d paged KV tensors in %d groups, layout '%s' %s",
                    len(kv_caches), len(parts), self._paged.kind,
                    [list(p.layers[0].shape) for p in parts])

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        # The step's forward pass runs between this and wait_for_save: its seconds, less the
        # synchronous loads, are the planner's prefill samples.
        self._step_t0 = time.perf_counter()
        self._step_sync_s = 0.0
        super().bind_connector_metadata(connector_metadata)

    @_timed
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if (not isinstance(meta, KvtierConnectorMetadata) or not meta.loads or not self._paged
                or self._cache is None):
            return
        t0 = time.perf_counter()
        for t in meta.loads:
            if t.is_async:
                self._counters.add(async_loads=1)
                self._loader.submit(t)
            else:
                self._finish_load(t, self._load(t))
        self._step_sync_s += time.perf_counter() - t0
        self._dump_stats()

    def _load(self, t: _Transfer) -> _LoadOutcome:
        """Looks up and loads t's blocks into vLLM's pages; on vLLM's thread (synchronous loads)
        or the loader thread (asynchronous ones). Touches no connector state but counters.
        t.keys: the chain's blocks, then (t.states of them) the last block's state record."""
        n = len(t.keys) - t.states
        out = _LoadOutcome()
        t0 = time.perf_counter()
        # Host hits are lent LOAD_CHUNK_BYTES at a time and copied once, into vLLM's pages; a
        # scratch as long as the hit would be gigabytes for a long prefix, and each first touch
        # of fresh pages faults (measured: a first 3456-token load 120-270 ms slower than the
        # next). Hits from below stay one call: one batch for the tier. (Two threads copying the
        # chunks of a 32 MiB host hit took as long as one here: 7.9 against 7.8 ms.)
        chunk = max(1, min(n, LOAD_CHUNK_BYTES // self._layout.bytes_per_block))
        try:
            keys = [kvtier.BlockKey(hi, lo) for hi, lo in t.keys]
            with self._cache.lookup_keys(keys, tenant=t.tenant, lora_id=t.lora_id,
                                         session_id=t.session) as hit:
                m = min(hit.hit_blocks, n, t.restorable)
                if t.states and hit.hit_blocks < len(keys):
                    m = 0  # the state record is gone: nowhere to resume
                if m > 0:
                    deepest = max(hit.source[:hit.hit_blocks])
                    out.tier = self._tier_of(deepest)
                    out.loaded = self._load_chunks(t, hit, m, chunk if deepest == 0 else m)
                    if t.states and (out.loaded < n or not self._load_state(t, hit, n)):
                        out.loaded = 0  # blocks without the state at their end: no resume
        except kvtier.KvtierError as e:
            self._warn_once("load", f"kvtier: load failed ({e}); recomputing")
        out.written_tokens = max(0, (t.first_block + out.loaded) * self._kb - t.from_token)
        out.failed = out.loaded < n
        if out.failed and self._whole_request_failures:
            out.written_tokens = 0  # vLLM recomputes the whole request
        elif not self._whole_request_failures:
            part = self._paged.parts[0]
            out.failed_ids = [p for p in t.pages[0][out.loaded * part.keep:] if p >= 0]
        out.seconds = time.perf_counter() - t0
        out.nbytes = (out.loaded + (t.states if out.loaded else 0)) * self._layout.bytes_per_block
        return out

    def _load_state(self, t: _Transfer, hit, first: int) -> bool:
        """The state record (hit blocks from first on) into the pages vLLM gave the last
        block's state groups."""
        buf = self._staging.take(t.states)
        try:
            if self._cache.load(hit, buf[:t.states], first=first).loaded_blocks < t.states:
                return False
            self._paged.scatter_states(self._paged.records(buf[:t.states]),
                                       [pages[-1:] for pages in t.pages])
            return True
        finally:
            self._staging.give(buf)

    def _load_chunks(self, t: _Transfer, hit, m: int, step: int) -> int:
        """Loads hit blocks [0, m) into vLLM's pages: host blocks copied once, straight from the
        tier (lent in place), the others through one reused buffer of step blocks; returns how
        many leading blocks loaded. vLLM's own hit may end inside the first block: those pages
        are -1 and left as they are."""
        k = min(step, m)
        buf = self._staging.take(k)
        try:
            return self._paged.load(self._cache, hit, m, [
                pages[:m * part.keep] for part, pages in zip(self._paged.parts, t.pages)], buf[:k])
        finally:
            self._staging.give(buf)

    def _finish_load(self, t: _Transfer, out: _LoadOutcome) -> None:
        """On vLLM's thread: reports what t's load did (failures, timings, counters)."""
        n = len(t.keys) - t.states
        if self._whole_request_failures:
            if out.failed:
                self._failed_recv.add(t.req_id)
        else:
            self._load_errors.update(out.failed_ids)
        if out.loaded:
            self._worker_meta.loads.append((t.req_id, out.tier, out.loaded, out.nbytes,
                                            out.seconds))
            self._counters.add_tier(out.tier, "loaded_tokens", out.written_tokens)
        if out.failed:
            # A grouped layout's request recomputes all of its prompt (vLLM's failed_recving).
            lost = ((t.first_block + n) * self._kb if self._whole_request_failures
                    else (n - out.loaded) * self._kb)
            self._counters.add_tier(out.tier or self._tier_of(0), "recomputed_by_failure_tokens",
                                    lost)
        self._worker_meta.done.append(t.req_id)
        self._counters.add(load_blocks=out.loaded, load_failed_blocks=n - out.loaded,
                           loaded_tokens=out.written_tokens,
                           promised_missed_blocks=n - out.loaded)
        if out.loaded < n:
            self._warn_once("load-short", f"kvtier: {n - out.loaded} of {n} blocks of request "
                                          f"{t.req_id} did not load; vLLM recomputes them")

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving = self.get_finished(finished_req_ids)
        failed, self._failed_recv = self._failed_recv, set()
        return KVConnectorTransferResults(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()) | failed,
                                          failed_recving=failed)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                set[str] | None]:
        # A finished load's failed blocks go out in this same pass: vLLM reads
        # get_block_ids_with_load_errors right after this call.
        done = self._loader.take_done()
        if not done:
            return None, None
        for t, out in done:
            self._finish_load(t, out)
        self._dump_stats()
        return None, {t.req_id for t, _ in done}

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        meta, self._worker_meta = self._worker_meta, KvtierWorkerMetadata()
        if not (meta.loads or meta.steps or meta.done):
            return None
        return meta

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        return  # saves run once per step in wait_for_save, over all layers

    @_timed
    def wait_for_save(self):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if isinstance(meta, KvtierConnectorMetadata) and meta.step >= 0 and self._step_t0:
            seconds = time.perf_counter() - self._step_t0 - self._step_sync_s
            self._worker_meta.steps.append((meta.step, seconds))
            self._step_t0 = 0.0
        if (not isinstance(meta, KvtierConnectorMetadata) or not meta.saves or not self._paged
                or self._cache is None):
            return
        # One copy for every block of the step, into a reused staging buffer; after it vLLM
        # may reuse its pages, and the saver stores the copies while vLLM computes on. State
        # records (t.resume: where vLLM kept every state) follow the blocks in the same buffer.
        n = sum(len(t.keys) for t in meta.saves)
        m = self._state_blocks
        r = sum(len(t.resume) for t in meta.saves)
        buf = self._staging.take(n + r * m)
        staging = buf[:n]
        self._paged.gather([[p for t in meta.saves for p in t.pages[g]]
                            for g in range(len(self._groups))], staging)
        if r:
            self._paged.gather_states(
                [[t.pages[g][i] for t in meta.saves for i, _ in t.resume]
                 for g in range(len(self._groups))], self._paged.records(buf[n:n + r * m]))
        batch, off, rec = [], 0, n
        for t in meta.saves:
            k = len(t.keys)
            batch.append((t.keys, staging[off:off + k], t.first_block, t.tenant, t.lora_id,
                          t.session, engine_hashes(t.engine)))
            for i, keys in t.resume:  # block i's state record, under its state keys
                batch.append((keys, buf[rec:rec + m], t.first_block + i, t.tenant, t.lora_id,
                              t.session, []))
                rec += m
            off += k
        n += r * m
        if not self._saver.submit(batch,
                                  lambda results, buf=buf: self._saved(batch, results, buf)):
            self._staging.give(buf)
            self._counters.add(save_failed_blocks=n)
            self._warn_once("save-queue", "kvtier: the save queue is full; dropping blocks "
                                          "(later requests miss them)")

    def _saved(self, batch, results, buf) -> None:
        # On the saver's thread: the staging buffer is free again.
        self._staging.give(buf)
        stored = failed = 0
        for (keys, *_), (result, error) in zip(batch, results):
            n = len(keys)
            if error is not None:
                bad = n
                self._warn_once("store", f"kvtier: store failed ({error})")
            else:
                bad = result.failed_blocks
                if bad:
                    self._warn_once("store", f"kvtier: {bad} blocks not stored "
                                             f"({result.first_error})")
            stored += n - bad
            failed += bad
        self._counters.add(save_blocks=stored, save_failed_blocks=failed)
        self._dump_stats()

    @_timed
    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        # Loads write into vLLM's pages: they end before vLLM frees them.
        self._loader.wait_idle(30.0)
        if self._saver is not None:
            self._saver.wait_idle(30.0)
        self._write_stats()
