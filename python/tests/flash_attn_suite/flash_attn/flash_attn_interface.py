"""The suite's imports from flash_attn.flash_attn_interface. _get_block_size_n is a flash_attn
kernel's tile width, which the suite reads only to decode its dropout masks: the plugin skips
dropout, so it is never called."""

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    raise NotImplementedError("_get_block_size_n: flash_attn's private tiling, which flash_attention_scratch "
                              "does not have (read only with dropout)")
