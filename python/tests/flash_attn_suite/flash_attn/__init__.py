"""flash_attn's public names over flash_attention_scratch, for running flash_attn's own test
suite (tests/test_flash_attn.py, upstream and unmodified) against this package: the functions are
the package's, which take flash_attn's signatures; nothing here computes attention."""

from flash_attention_scratch import (  # noqa: F401
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
