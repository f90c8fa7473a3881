"""The Transformers integration: the attention function, mask specs, the model zoo."""
