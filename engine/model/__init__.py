"""Llama-family decoder over a paged KV cache, and its Hugging Face checkpoint loader."""
