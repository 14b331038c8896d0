"""What CUDA's SDPA keeps where the CPU's differs, for tests that count a layer on the CPU."""


def fp32_gqa_math_extra_bytes(q: int, kv: int, o: int, heads: int, seq: int, tokens: int,
                              o_proj_copy_on_cpu: bool = False) -> int:
    """CUDA less CPU, fp32 SDPA with GQA and no mask (transformers passes enable_gqa): the CPU's flash
    kernel takes fp32 and GQA and keeps q, k, v (kv wide each), its output (o wide; o_proj reads a
    view of it, or a contiguous copy where q came out of torch.cat) and a 4-byte log-sum-exp a head;
    CUDA's flash kernel takes fp16/bf16 only and its memory-efficient kernel no enable_gqa, so the
    math kernel (_scaled_dot_product_attention_math) keeps q scaled (q wide), k repeated and scaled
    (q), v repeated (o), the fp32 softmax output (heads x seq) and o_proj's contiguous input (o).
    Measured on an H200 (planner/saved/hf_llama.py hf_attention_core_saved)."""
    cpu = 4 * (q + 2 * kv + o + (o if o_proj_copy_on_cpu else 0)) + 4 * heads
    cuda = 4 * (2 * q + 2 * o + heads * seq)
    return tokens * (cuda - cpu)
