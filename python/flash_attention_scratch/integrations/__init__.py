"""Adapters that plug flash_attention_scratch into other libraries' attention hooks."""
