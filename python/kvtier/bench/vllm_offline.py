"""vLLM driven offline on token ids, shared by the vLLM tests (python/tests/vllm_run.py) and
the comparison harness (compare_vllm.py): no tokenizer, no hub, greedy, eager.

Call configure_env() before vLLM is imported: it sets the environment defaults the runs need on
a shared CPU machine (each only where the caller has not set it).
"""

import json
import os
import random
import time

VOCAB = 512
BLOCK_SIZE = 32  # vLLM's block (the CPU kernels want a multiple of 32)
KVTIER_BLOCK = 128  # 4 vLLM blocks per kvtier block

# Random-weight Llamas made locally (seeded, fp32, head_dim 64, a 512-token vocabulary).
#   test:    the tiny model of the correctness runs (recomputing a prefix costs almost nothing).
#   compare: Llama-proportioned for the comparison: GQA with 8 KV heads (2 query heads per KV
#            head), an MLP 2.75x wide, sized so a 4K-token prefill takes seconds on 2 CPU cores.
MODELS = {
    "test": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 max_position_embeddings=4096),
    "compare": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                    num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                    max_position_embeddings=8192),
}


# Random-weight models of the other attention kinds (issue 34's families), the test model's size:
#   mla:    DeepSeek-V2-style MLA (a 512 + 64 latent, the only width vLLM's CPU MLA kernels take)
#   swa:    Mistral with a 32-token sliding window on every layer (one sliding-window group)
#   gemma2: Gemma 2, sliding-window and full-attention layers alternating (two groups)
#   qwen3next: Qwen3-Next, three gated-delta-net (linear-attention state) layers and one full
#              attention layer (four groups); the last layer MoE, as vLLM's CPU build needs one;
#              64-wide linear heads (vLLM's CPU kernel takes 64 and 128, and runs them in bf16)
FAMILY_COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                     num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=4096,
                     tie_word_embeddings=False)


def _family_model(family: str):
    from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, Gemma2Config,
                              Gemma2ForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen3NextConfig, Qwen3NextForCausalLM)

    c = dict(FAMILY_COMMON)
    if family == "mla":
        # Dense MLP layers only (first_k_dense_replace = all): no MoE kernel in the way.
        return DeepseekV2ForCausalLM(DeepseekV2Config(
            num_key_value_heads=4, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
            qk_nope_head_dim=64, v_head_dim=64, first_k_dense_replace=4, n_routed_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=128, n_shared_experts=1, **c))
    if family == "swa":
        return MistralForCausalLM(MistralConfig(num_key_value_heads=2, head_dim=64,
                                                sliding_window=32, **c))
    if family == "gemma2":
        # vLLM's Gemma 2 ties the output to the embedding; no soft-capping, so the random
        # logits stay peaked.
        c["tie_word_embeddings"] = True
        return Gemma2ForCausalLM(Gemma2Config(
            num_key_value_heads=2, head_dim=64, sliding_window=32, query_pre_attn_scalar=64,
            final_logit_softcapping=None, attn_logit_softcapping=None, **c))
    if family == "qwen3next":
        return Qwen3NextForCausalLM(Qwen3NextConfig(
            num_key_value_heads=2, head_dim=64,
            layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=1,
            linear_num_value_heads=1, linear_key_head_dim=64, linear_value_head_dim=64,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=128, shared_expert_intermediate_size=128,
            decoder_sparse_step=1, mlp_only_layers=[0, 1, 2], partial_rotary_factor=0.5, **c))
    raise ValueError(f"unknown model family {family!r} (known: {', '.join(FAMILIES)})")


FAMILIES = ("mla", "swa", "gemma2", "qwen3next")


def configure_env() -> None:
    """Before vLLM is imported: no hub, a small KV space, no thread pinning on a shared machine,
    transparent huge pages, and the engine core in this process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    # Transparent huge pages for torch's large CPU allocations (weights, the KV pages): without
    # them two processes started alike differed by up to 16% in CPU per token here, with them by
    # under 6%, so runs compared across processes compare the runs, not their page placement.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # One process: the engine core runs in this process and the worker inside it (executor
    # "uni"), so vLLM and torch are imported once per run (each import costs tens of seconds).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def make_model(path: str, preset: str = "test") -> dict:
    """Writes the preset's model to `path` (config.json, model.safetensors); returns its config."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    if preset in FAMILIES:
        model = _family_model(preset)
    else:
        cfg = LlamaConfig(vocab_size=VOCAB, torch_dtype="float32", tie_word_embeddings=False,
                          **MODELS[preset])
        model = LlamaForCausalLM(cfg)
    # Larger weights than the default init give peaked logits, so greedy tokens are robust.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
        if preset == "mla":
            # Its attention runs in bf16 (vLLM's AMX MLA kernels): wide logit gaps keep greedy
            # tokens the same whether a prefix is computed or loaded.
            model.lm_head.weight.normal_(0.0, 0.5)
        if preset == "qwen3next":
            # Slow decay (exp(A_log) near 0): the recurrent state carries the whole prefix, so a
            # turn resumed from a wrong or missing state gives other tokens.
            for layer in model.model.layers[:3]:
                layer.linear_attn.A_log.fill_(-8.0)
        if preset == "gemma2":
            # Gemma scales the (tied) embedding by sqrt(hidden): a small one keeps the output
            # from copying its input token.
            model.model.embed_tokens.weight.normal_(0.0, 0.003)
    model.to(torch.float32).save_pretrained(path, safe_serialization=True)
    return dict(MODELS.get(preset, FAMILY_COMMON))


def model_layout(path: str) -> dict:
    """The KV layout the kvtier connector derives from the model folder (fp32 KV)."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    return {"num_layers": cfg["num_hidden_layers"], "num_kv_heads": cfg["num_key_value_heads"],
            "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            "dtype": "fp32", "block_tokens": KVTIER_BLOCK}


def layout_yaml(layout: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in layout.items()) + "}"


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def metric_sum(llm, name: str) -> float:
    total = 0.0
    for m in llm.get_metrics():
        if m.name == name and hasattr(m, "value"):
            total += m.value
    return total


def kvtier_transfer_config(extra: dict) -> dict:
    """vLLM's kv_transfer_config for kvtier's connector with `extra` as its extra config."""
    cfg = {"block_tokens": KVTIER_BLOCK}
    cfg.update(extra)
    return {"kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.integrations.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": cfg}


def make_llm(spec: dict):
    """vllm.LLM for spec: model, prefix_caching, and optionally kvtier (the connector's extra
    config), kv_transfer_config (any connector's), executor, async_scheduling, max_model_len,
    max_num_batched_tokens,
    num_gpu_blocks_override (or gpu_blocks), kv_events (vLLM's own KV events' endpoints).
    Returns (llm, seconds the start took)."""
    from vllm import LLM

    kw = dict(model=spec["model"], skip_tokenizer_init=True, enforce_eager=True,
              dtype=spec.get("dtype", "float32"), block_size=spec.get("block_size", BLOCK_SIZE),
              max_model_len=spec.get("max_model_len", 4096),
              max_num_seqs=8, enable_prefix_caching=spec["prefix_caching"],
              disable_log_stats=False, seed=0,
              distributed_executor_backend=spec.get("executor", "uni"))
    if spec.get("attention_backend"):  # e.g. CPU_MLA: vLLM's reference MLA (fp32, block 16)
        kw["attention_config"] = {"backend": spec["attention_backend"]}
    if spec.get("max_num_batched_tokens"):  # smaller prefill chunks
        kw["max_num_batched_tokens"] = spec["max_num_batched_tokens"]
    if spec.get("async_scheduling") is not None:
        kw["async_scheduling"] = spec["async_scheduling"]
    # A small KV space, so vLLM evicts what it cached (gpu_blocks: the vLLM tests' name).
    blocks = spec.get("num_gpu_blocks_override") or spec.get("gpu_blocks")
    if blocks:
        kw["num_gpu_blocks_override"] = blocks
    if spec.get("kv_events"):  # vLLM's own KV events: {"endpoint": ..., "replay_endpoint": ...}
        kw["kv_events_config"] = {"enable_kv_cache_events": True, "publisher": "zmq",
                                  "topic": "vllm", **spec["kv_events"]}
    if spec.get("kvtier") is not None:
        kw["kv_transfer_config"] = kvtier_transfer_config(spec["kvtier"])
    elif spec.get("kv_transfer_config") is not None:
        kw["kv_transfer_config"] = spec["kv_transfer_config"]
    t0 = time.perf_counter()
    llm = LLM(**kw)
    return llm, round(time.perf_counter() - t0, 2)


def generate(llm, prompts, max_tokens):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                        detokenize=False)
    return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)


def make_switchable(hooks) -> list[bool]:
    """Lets a process turn its kvtier connector's work off and on between requests (hooks: the
    kvtier.integrations.vllm module): off, the scheduler half reports no external hit and plans
    no transfer, so the worker half has nothing to do, and what is left is vLLM's own connector
    plumbing. The same process measured both ways has the same memory placement, which two
    processes do not (their speed differs by several per cent with no connector at all).
    Returns the switch: set [0] to False for off."""
    on = [True]
    cls = hooks.KvtierConnector
    meta_cls = hooks.KvtierConnectorMetadata
    patched = {"get_num_new_matched_tokens": lambda self, *a, **k: (0, False),
               "update_state_after_alloc": lambda self, *a, **k: None,
               "build_connector_meta": lambda self, *a, **k: meta_cls(),
               "request_finished": lambda self, *a, **k: (False, None)}
    for name, off in patched.items():
        real = getattr(cls, name)

        def switch(self, *a, _real=real, _off=off, **k):
            return _real(self, *a, **k) if on[0] else _off(self, *a, **k)

        setattr(cls, name, switch)
    return on
