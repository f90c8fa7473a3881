"""Runnable examples: the Transformers backend, context parallelism, SFT of stock VLMs."""
